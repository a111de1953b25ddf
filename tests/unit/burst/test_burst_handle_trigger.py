"""Job handle round trip, trigger serialization, event validation and the cancel/teardown step sequence."""

from __future__ import annotations

import json
import logging

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.triggers import BurstJobTrigger
from npa_airflow.burst.watch import cancel_steps, make_event, validate_event
from npa_airflow.exceptions import NpaValidationError

RID = "63e57704-ba0f-4b9a-a7d1-74dd0df7ba6d"
LOG = logging.getLogger("test")
IDENT = sky.Identity()


def handle(**overrides) -> BurstJobHandle:
    args = dict(
        conn_id="skypilot_default",
        endpoint="http://127.0.0.1:46580",
        cluster="npa-demo-0123456789-t1",
        name="demo",
        request_id=RID,
        submitted_at=1796217346.5,
    )
    args.update(overrides)
    return BurstJobHandle(**args)


def test_handle_round_trips_through_json():
    h = handle(job_id=3)
    assert BurstJobHandle.from_json(h.to_json()) == h
    assert BurstJobHandle.from_dict(json.loads(json.dumps(h.to_dict()))) == h
    assert h.to_dict()["job_id"] == 3


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"cluster": "Bad Cluster"}, "cluster"),
        ({"request_id": "x; rm"}, "request_id"),
        ({"job_id": -1}, "job_id"),
        ({"job_id": True}, "job_id"),
        ({"endpoint": "127.0.0.1:46580"}, "endpoint"),
        ({"teardown": "stop"}, "teardown"),
        ({"conn_id": "a b"}, "conn_id"),
    ],
)
def test_handle_validates_every_field(overrides, field):
    with pytest.raises(NpaValidationError, match=f"BurstJobHandle.{field}="):
        handle(**overrides)


def test_handle_from_dict_refuses_unknown_and_missing_fields():
    with pytest.raises(NpaValidationError, match="unknown fields"):
        BurstJobHandle.from_dict({**handle().to_dict(), "password": "x"})
    with pytest.raises(NpaValidationError, match="lacks"):
        BurstJobHandle.from_dict({"conn_id": "c"})
    with pytest.raises(NpaValidationError, match="not JSON"):
        BurstJobHandle.from_dict("{nope")


def test_trigger_serializes_to_its_constructor_kwargs():
    trigger = BurstJobTrigger(handle=handle().to_dict(), poll_interval=5, deadline=1796220000.0, nodes=2)
    classpath, kwargs = trigger.serialize()
    assert classpath == "npa_airflow.burst.triggers.BurstJobTrigger"
    again = BurstJobTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert kwargs["cancel_on_kill"] is True and kwargs["nodes"] == 2


def test_trigger_goes_through_airflows_trigger_persistence():
    from airflow.models.trigger import Trigger

    trigger = BurstJobTrigger(handle=handle(job_id=1).to_dict(), poll_interval=5)
    row = Trigger.from_object(trigger)
    assert row.classpath == "npa_airflow.burst.triggers.BurstJobTrigger"
    assert BurstJobTrigger(**row.kwargs).serialize() == trigger.serialize()


def test_events_are_validated_before_use():
    event = make_event("success", handle(job_id=1), "done", "SUCCEEDED")
    status, h, message = validate_event(event)
    assert (status, h.job_id, message) == ("success", 1, "done")
    with pytest.raises(ValueError, match="malformed"):
        validate_event({"status": "weird", "handle": {}, "message": ""})
    with pytest.raises(ValueError):
        make_event("weird", handle(), "x")


def drive(steps, answers):
    """Run the step generator with scripted answers; return the steps it asked for."""
    asked, answer = [], None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration:
            return asked
        asked.append(step)
        answer = answers.pop(0)


def paths(asked):
    return [(op, arg.path if isinstance(arg, sky.ApiRequest) else arg) for op, arg in asked]


def test_cancel_during_launch_cancels_the_request_then_downs_the_cluster():
    running = sky.RequestResult(request_id=RID, name="sky.launch", status="RUNNING")
    asked = drive(cancel_steps(handle(), IDENT, LOG), [{RID: running}, [RID], None])
    assert paths(asked) == [("statuses", [RID]), ("cancel", [RID]), ("call", "/down")]
    assert asked[2][1].body["cluster_name"] == "npa-demo-0123456789-t1"


def test_cancel_after_launch_finished_cancels_the_job_it_created():
    done = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED")
    got = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED", return_value={"job_id": 4})
    asked = drive(cancel_steps(handle(), IDENT, LOG), [{RID: done}, got, None, None])
    assert paths(asked) == [("statuses", [RID]), ("get", RID), ("call", "/cancel"), ("call", "/down")]
    assert asked[2][1].body["job_ids"] == [4]


def test_cancel_of_a_known_job_and_kept_cluster():
    asked = drive(cancel_steps(handle(job_id=2, teardown="keep"), IDENT, LOG), [None])
    assert paths(asked) == [("call", "/cancel")]


def test_without_waiting_the_cancel_and_teardown_are_only_submitted():
    """The triggerer bounds on_kill (30 s): the API server must be left to finish cancel and teardown."""
    asked = drive(cancel_steps(handle(job_id=2), IDENT, LOG, wait=False), ["r-cancel", "r-down"])
    assert paths(asked) == [("submit", "/cancel"), ("submit", "/down")]
    done = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED")
    got = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED", return_value={"job_id": 4})
    asked = drive(cancel_steps(handle(), IDENT, LOG, wait=False), [{RID: done}, got, "r-cancel", "r-down"])
    assert paths(asked) == [("statuses", [RID]), ("get", RID), ("submit", "/cancel"), ("submit", "/down")]
    assert asked[2][1].body["job_ids"] == [4]


def test_teardown_only_after_a_normal_ending_and_a_gone_cluster_is_fine():
    gone = sky.SkyPilotApiError("gone", error_type="ClusterDoesNotExist")
    asked = drive(cancel_steps(handle(job_id=2), IDENT, LOG, cancel=False), [gone])
    assert paths(asked) == [("call", "/down")]


def test_a_failed_teardown_is_retried_then_reported(caplog):
    flaky = sky.SkyPilotApiError("scancel failed", error_type="CommandError")
    asked = drive(cancel_steps(handle(job_id=2), IDENT, LOG, cancel=False), [flaky, None, None])
    assert paths(asked) == [("call", "/down"), ("sleep", 5.0), ("call", "/down")]
    with caplog.at_level(logging.WARNING, logger="test"):
        asked = drive(cancel_steps(handle(job_id=2), IDENT, LOG, cancel=False), [flaky, None, flaky, None, flaky])
    assert [op for op, _ in asked] == ["call", "sleep", "call", "sleep", "call"]
    assert "may still hold nodes" in caplog.text


def test_probe_operator_runs_the_slurm_sides_all_reduce_script_under_the_launcher():
    from pathlib import Path

    from npa_airflow.burst.launcher import render_launcher
    from npa_airflow.burst.operators import BurstNcclProbeOperator
    from npa_airflow.burst.task import build_task

    op = BurstNcclProbeOperator(task_id="probe", image=None, nodes=2, gpu_per_node="H100:8", collective_timeout=60)
    spec = op.spec()
    assert (Path(spec.workdir) / "nccl_allreduce_probe.py").is_file()
    task = build_task(spec, render_launcher(spec))
    assert task["envs"] == {"NPA_PROBE_COLLECTIVE_TIMEOUT": "60"}
    assert task["run"].rstrip().endswith('--master-port="$MASTER_PORT" \\\n  nccl_allreduce_probe.py')


class ScriptedClient:
    """Stand-in for AsyncSkyPilotClient at the HTTP boundary: answers job_status calls from a script."""

    identity = IDENT

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = 0

    async def call(self, request, timeout=None):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_watch_retries_a_transient_job_status_failure_then_reports_the_end():
    from npa_airflow.burst.watch import watch_job

    flaky = sky.SkyPilotApiError("srun: Socket timed out", error_type="CommandError")
    client = ScriptedClient([{"1": "PENDING"}, flaky, flaky, {"1": "RUNNING"}, {"1": "SUCCEEDED"}])
    event = await watch_job(client, handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG)
    assert (event["status"], event["native_state"], client.calls) == ("success", "SUCCEEDED", 5)


async def test_watch_gives_up_after_repeated_job_status_failures_and_on_a_gone_cluster():
    from npa_airflow.burst.watch import MAX_CONSECUTIVE_API_ERRORS, watch_job

    flaky = sky.SkyPilotApiError("boom", error_type="CommandError")
    client = ScriptedClient([flaky] * MAX_CONSECUTIVE_API_ERRORS)
    event = await watch_job(client, handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG)
    assert event["status"] == "failed" and "unavailable 5 times" in event["message"]
    gone = sky.SkyPilotApiError("gone", error_type="ClusterDoesNotExist")
    event = await watch_job(
        ScriptedClient([gone]), handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG
    )
    assert event["status"] == "failed" and "is gone" in event["message"]


async def test_watch_fires_the_deadline_while_pending():
    from npa_airflow.burst.watch import watch_job

    client = ScriptedClient([{"1": "PENDING"}])
    event = await watch_job(client, handle(job_id=1), poll_interval=0, deadline=1.0, stream_logs=False, log=LOG)
    assert event["status"] == "deadline" and "PENDING" in event["message"]
