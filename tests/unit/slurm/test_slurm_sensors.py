"""SlurmJobSensor: job references and the deferral to a trigger that never cancels."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.triggers import make_event_payload
from tests.harness.slurm_operator_doubles import context, handle_dict, install_unit_connection


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    install_unit_connection(monkeypatch)


def test_sensor_accepts_a_handle_a_rendered_handle_or_a_job_id():
    from npa_airflow.slurm.sensors import parse_job_reference

    watched = {**handle_dict(), "script_path": None}  # the sensor only watches: it writes and removes nothing
    with_sidecar = {**handle_dict(), "env_file": "/shared/results/sidecars/x.env"}
    assert parse_job_reference(with_sidecar) == watched
    assert parse_job_reference(json.dumps(handle_dict())) == watched
    assert parse_job_reference(str(handle_dict())) == watched  # what a non-native Jinja render gives
    assert parse_job_reference(" 12345_7 ") == "12345_7"
    assert parse_job_reference(42) == "42"
    with pytest.raises(NpaValidationError, match="neither a Slurm job id"):
        parse_job_reference("12345; scancel -u everyone")
    with pytest.raises(NpaValidationError, match="unknown keys"):
        parse_job_reference({**handle_dict(), "evil": 1})


def test_sensor_defers_with_a_trigger_that_never_cancels_someone_elses_job():
    from npa_airflow.slurm.sensors import SlurmJobSensor

    sensor = SlurmJobSensor(task_id="wait", job=handle_dict(), slurm_conn_id="slurm_unit", timeout=600)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context())
    trigger = deferred.value.trigger
    assert trigger.handle.to_dict() == {**handle_dict(), "script_path": None} and trigger.cancel_on_kill is False
    assert trigger.handle.secret_files == ()
    assert trigger.deadline is not None
    assert sensor.execute_complete(context(), make_event_payload("success", handle_dict(), "ok")) == handle_dict()
    with pytest.raises(AirflowFailException, match="ended FAILED"):
        sensor.execute_complete(context(), make_event_payload("failed", handle_dict(), "Slurm job 101 ended FAILED"))
