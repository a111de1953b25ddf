"""Waiting for a burst job (burst/watch.py): its events, and how the watch reads the hook's answers."""

from __future__ import annotations

import asyncio
import logging

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst.hook import SkyPilotHook
from npa_airflow.burst.watch import event_handle, make_event, validate_event
from npa_airflow.exceptions import NpaConnectionError
from tests.harness.burst_doubles import RID, ScriptedClient
from tests.harness.burst_doubles import burst_handle as handle

LOG = logging.getLogger("test")


def test_events_are_validated_before_use():
    event = make_event("success", handle(job_id=1), "done", "SUCCEEDED")
    assert validate_event(event) is event  # the Slurm events' shape (common/trigger_events.py)
    assert (event["status"], event_handle(event).job_id, event["message"]) == ("success", 1, "done")
    with pytest.raises(ValueError, match="must be a dict"):
        validate_event("success")
    with pytest.raises(ValueError, match="lacks"):
        validate_event({"status": "success", "handle": {}})
    with pytest.raises(ValueError, match="unknown status 'weird'"):
        validate_event({"status": "weird", "handle": {}, "message": ""})
    with pytest.raises(ValueError, match="lacks"):
        event_handle({**event, "handle": {"cluster": "c"}})  # NpaValidationError, a ValueError
    with pytest.raises(ValueError, match="unknown burst trigger event status"):
        make_event("weird", handle(), "x")


async def test_watch_retries_a_transient_job_status_failure_then_reports_the_end():
    from npa_airflow.burst.watch import watch_job

    flaky = sky.SkyPilotApiError("srun: Socket timed out", error_type="CommandError")
    record = {"job_id": 1, "start_at": 10.0, "end_at": 70.0, "resources": "1x[GPU:1]"}
    client = ScriptedClient([{"1": "PENDING"}, flaky, flaky, {"1": "RUNNING"}, {"1": "SUCCEEDED"}, [record]])
    event = await watch_job(
        SkyPilotHook(client=client), handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG
    )
    assert (event["status"], event["native_state"], client.calls) == ("success", "SUCCEEDED", 6)
    assert event["usage"] == {"gpus": 1, "nodes": 1, "elapsed_seconds": 60, "gpu_hours": 60 / 3600}


async def test_watch_gives_up_after_repeated_job_status_failures_and_on_a_gone_cluster():
    from npa_airflow.burst.watch import MAX_CONSECUTIVE_API_ERRORS, watch_job

    flaky = sky.SkyPilotApiError("boom", error_type="CommandError")
    client = ScriptedClient([flaky] * MAX_CONSECUTIVE_API_ERRORS)
    event = await watch_job(
        SkyPilotHook(client=client), handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG
    )
    # The job's state is unknown, not failed: the cluster is left for the next try.
    assert event["status"] == "interrupted" and "unavailable 5 times" in event["message"]
    gone = sky.SkyPilotApiError("gone", error_type="ClusterDoesNotExist")
    event = await watch_job(
        SkyPilotHook(client=ScriptedClient([gone])),
        handle(job_id=1),
        poll_interval=0,
        deadline=None,
        stream_logs=False,
        log=LOG,
    )
    assert event["status"] == "failed" and "is gone" in event["message"]


async def test_watch_fires_the_deadline_while_pending():
    from npa_airflow.burst.watch import watch_job

    client = ScriptedClient([{"1": "PENDING"}])
    event = await watch_job(
        SkyPilotHook(client=client), handle(job_id=1), poll_interval=0, deadline=1.0, stream_logs=False, log=LOG
    )
    assert event["status"] == "deadline" and "PENDING" in event["message"]


def _watch(client, **kwargs):
    from npa_airflow.burst.watch import watch_job

    hook = kwargs.pop("hook", None) or SkyPilotHook(client=client)
    return asyncio.run(
        watch_job(hook, kwargs.pop("job", handle()), poll_interval=0, deadline=None, stream_logs=False, log=LOG)
    )


def test_an_outage_while_reading_the_launch_result_is_waited_out():
    """``/api/get`` after the launch shares the outage budget with the status polls (it used to fail the wait)."""
    done = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED")
    got = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED", return_value={"job_id": 3})
    down = NpaConnectionError("SkyPilot API server at http://sky.test unreachable: ConnectError")
    client = ScriptedClient([{RID: done}, down, down, got, {"3": "SUCCEEDED"}])
    event = _watch(client)
    assert (event["status"], event["handle"]["job_id"]) == ("success", 3)


def test_an_outage_past_the_budget_interrupts_the_wait(monkeypatch):
    from npa_airflow.burst import watch

    monkeypatch.setattr(watch, "MAX_UNREACHABLE_SECONDS", 0.0)
    down = NpaConnectionError("unreachable")
    event = _watch(ScriptedClient([{"1": "RUNNING"}, down, down]), job=handle(job_id=1))
    assert event["status"] == "interrupted" and "unreachable for more than 0 s" in event["message"]
    assert event["native_state"] == "RUNNING"


def test_a_connection_that_cannot_be_read_yet_is_waited_out_and_a_broken_wait_is_interrupted():
    from airflow.sdk.exceptions import AirflowNotFoundException

    client = ScriptedClient([{"1": "SUCCEEDED"}])

    class ResumingHook(SkyPilotHook):
        """As in a triggerer whose API server is briefly away: the connection is reported as not defined."""

        failures = 2

        async def aclient(self):
            if self.failures:
                self.failures -= 1
                raise AirflowNotFoundException("The conn_id `skypilot_default` isn't defined")
            return client

    event = _watch(client, hook=ResumingHook(), job=handle(job_id=1))
    assert event["status"] == "success"
    broken = _watch(ScriptedClient([ValueError("a bug")]), job=handle(job_id=1))
    assert broken["status"] == "interrupted" and "ValueError: a bug" in broken["message"]
