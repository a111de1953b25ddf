"""Waiting for a burst job (burst/watch.py): its events, and how the watch reads the hook's answers."""

from __future__ import annotations

import logging

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst.hook import SkyPilotHook
from npa_airflow.burst.watch import make_event, validate_event
from tests.harness.burst_doubles import ScriptedClient
from tests.harness.burst_doubles import burst_handle as handle

LOG = logging.getLogger("test")


def test_events_are_validated_before_use():
    event = make_event("success", handle(job_id=1), "done", "SUCCEEDED")
    status, h, message = validate_event(event)
    assert (status, h.job_id, message) == ("success", 1, "done")
    with pytest.raises(ValueError, match="malformed"):
        validate_event({"status": "weird", "handle": {}, "message": ""})
    with pytest.raises(ValueError):
        make_event("weird", handle(), "x")


async def test_watch_retries_a_transient_job_status_failure_then_reports_the_end():
    from npa_airflow.burst.watch import watch_job

    flaky = sky.SkyPilotApiError("srun: Socket timed out", error_type="CommandError")
    client = ScriptedClient([{"1": "PENDING"}, flaky, flaky, {"1": "RUNNING"}, {"1": "SUCCEEDED"}])
    event = await watch_job(
        SkyPilotHook(client=client), handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG
    )
    assert (event["status"], event["native_state"], client.calls) == ("success", "SUCCEEDED", 5)


async def test_watch_gives_up_after_repeated_job_status_failures_and_on_a_gone_cluster():
    from npa_airflow.burst.watch import MAX_CONSECUTIVE_API_ERRORS, watch_job

    flaky = sky.SkyPilotApiError("boom", error_type="CommandError")
    client = ScriptedClient([flaky] * MAX_CONSECUTIVE_API_ERRORS)
    event = await watch_job(
        SkyPilotHook(client=client), handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG
    )
    assert event["status"] == "failed" and "unavailable 5 times" in event["message"]
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
