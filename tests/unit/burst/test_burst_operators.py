"""Burst operators (burst/operators.py)."""

from __future__ import annotations

import pytest


def test_probe_operator_runs_the_slurm_sides_all_reduce_script_under_the_launcher():
    from pathlib import Path

    from npa_airflow.burst.launcher import render_launcher
    from npa_airflow.burst.operators import BurstNcclProbeOperator
    from npa_airflow.burst.task import build_task

    op = BurstNcclProbeOperator(task_id="probe", image=None, nodes=2, accelerators="H100:8", collective_timeout=60)
    spec = op.spec()
    assert (Path(spec.workdir) / "nccl_allreduce_probe.py").is_file()
    task = build_task(spec, render_launcher(spec))
    assert task["envs"] == {"NPA_PROBE_COLLECTIVE_TIMEOUT": "60"}
    assert task["run"].rstrip().endswith('--master-port="$MASTER_PORT" \\\n  nccl_allreduce_probe.py')


def _operator(client, **kwargs):
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.burst.operators import BurstTorchrunOperator

    op = BurstTorchrunOperator(
        task_id="train", image=None, nodes=1, accelerators="GPU:1", command="python t.py", **kwargs
    )
    op.get_hook = lambda: SkyPilotHook(client=client)
    return op


def _event(status, native=None, **handle_fields):
    from npa_airflow.burst.watch import make_event
    from tests.harness.burst_doubles import burst_handle

    return make_event(status, burst_handle(**handle_fields), f"it ended {status}", native)


def test_an_interrupted_wait_fails_for_a_retry_and_leaves_job_and_cluster_alone():
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from tests.harness.airflow_tasks import task_context
    from tests.harness.burst_doubles import ScriptedClient

    client = ScriptedClient([])
    with pytest.raises(AirflowException) as failure:
        _operator(client).execute_complete(task_context("d"), _event("interrupted", "RUNNING", job_id=1))
    assert not isinstance(failure.value, AirflowFailException)
    assert "left as they are: the next try adopts them" in str(failure.value)
    assert client.asked == []  # no cancel, no teardown


def test_a_failed_job_is_not_retried_and_shows_the_end_of_its_log_read_before_the_teardown():
    from airflow.sdk.exceptions import AirflowFailException

    from tests.harness.airflow_tasks import task_context
    from tests.harness.burst_doubles import ScriptedClient

    client = ScriptedClient([["step 9\n", "ValueError: bad config\n"], None])
    with pytest.raises(AirflowFailException, match="a program failure, not retried") as failure:
        _operator(client).execute_complete(task_context("d"), _event("failed", "FAILED", job_id=1))
    assert "ValueError: bad config" in str(failure.value)
    assert [(op, arg.path) for op, arg in client.asked] == [("stream", "/logs"), ("call", "/down")]
    assert client.asked[0][1].body["follow"] is False


def test_a_failed_launch_is_retried_and_a_job_cancelled_outside_airflow_is_not():
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from tests.harness.airflow_tasks import task_context
    from tests.harness.burst_doubles import ScriptedClient

    with pytest.raises(AirflowException, match="infrastructure reason") as failure:
        _operator(ScriptedClient([None])).execute_complete(task_context("d"), _event("failed"))
    assert not isinstance(failure.value, AirflowFailException)
    with pytest.raises(AirflowFailException, match="cancelled outside Airflow"):
        _operator(ScriptedClient([None])).execute_complete(task_context("d"), _event("canceled", "CANCELLED", job_id=1))


def test_an_adopted_launch_cancelled_by_a_clear_of_its_try_starts_this_try_anew():
    from tests.harness.airflow_tasks import task_context
    from tests.harness.burst_doubles import ScriptedClient

    op = _operator(ScriptedClient([]))
    op.execute = lambda context: "launched anew"
    event = _event("canceled", "CANCELLED", job_id=1, try_name="npa-d-train-0123456789-t1")
    assert op.execute_complete(task_context("d", try_number=2), event) == "launched anew"


def test_on_previous_try_is_checked_before_anything_runs():
    from npa_airflow.exceptions import NpaValidationError

    with pytest.raises(NpaValidationError, match="on_previous_try='keep' must be one of"):
        _operator(None, on_previous_try="keep")
