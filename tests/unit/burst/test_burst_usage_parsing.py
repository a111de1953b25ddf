"""A Burst job's GPU-hours (burst/usage.py) from the API server's job queue record, and the operator's report of
them (XCom `npa_usage` and one log line) whatever the outcome."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.burst import client as sky
from npa_airflow.burst.usage import NO_RECORD, NOT_ENDED, record_usage, resources_gpus, usage_fields
from npa_airflow.common import xcom_keys
from npa_airflow.common.usage import JobUsage, event_usage, usage_line
from npa_airflow.exceptions import NpaParseError
from tests.harness.airflow_tasks import collecting_logger, task_context
from tests.harness.burst_doubles import ScriptedClient, burst_handle

SAMPLE = json.loads((Path(__file__).parent / "samples" / "queue_result.json").read_text())["queue"]


def test_the_recorded_queue_record_of_a_two_node_job_gives_its_gpus_and_run_time():
    record = sky.parse_queue_record(SAMPLE, 1)
    assert record is not None and record["resources"] == "2x[GPU:2]"
    usage, why = record_usage(record)
    elapsed = record["end_at"] - record["start_at"]  # the job ran `sleep 12` on each node
    assert why == "" and usage == JobUsage(gpus=4, nodes=2, elapsed_seconds=round(elapsed))
    assert 12 <= usage.elapsed_seconds <= 14
    assert sky.parse_queue_record(SAMPLE, 2) is None
    with pytest.raises(NpaParseError, match="not a list"):
        sky.parse_queue_record({"job_id": 1}, 1)


@pytest.mark.parametrize(
    ("resources", "counted"),
    [
        ("2x[GPU:2]", (4, 2)),
        ("1x[H100:8]", (8, 1)),
        ("4x[A100-80GB:8][Spot]", (32, 4)),
        ("3x[CPU:1+]", (0, 3)),
        ("1x[CPU:4]", (0, 1)),
        ("2x[T4:0.5]", None),  # a shared fraction of a GPU
        ("GPU:2", None),
        (None, None),
    ],
)
def test_the_gpus_of_a_queue_records_resources(resources, counted):
    assert resources_gpus(resources) == counted


def test_a_record_without_an_end_or_a_start():
    base = {"resources": "2x[GPU:8]", "start_at": 100.0, "end_at": 580.4}
    assert record_usage(base) == (JobUsage(16, 2, 480), "")
    assert record_usage({**base, "end_at": None}) == (None, NOT_ENDED)
    assert record_usage({**base, "start_at": -1}) == (JobUsage(16, 2, 0), "")  # never RUNNING: cancelled pending
    assert record_usage(None) == (None, NO_RECORD)
    assert record_usage({**base, "resources": "?"})[0] is None


def test_usage_fields_are_what_the_operator_reads_back():
    fields = usage_fields({"resources": "2x[GPU:8]", "start_at": 0.0, "end_at": 480.0})
    usage, why = event_usage(fields)
    assert usage_line(usage, why) == "GPU usage: 2.13 GPU-hours (16 GPUs on 2 nodes x 8 min 0 s)"
    unknown = usage_fields({"resources": "2x[GPU:8]"}, "the job queue could not be read: boom")
    assert event_usage(unknown) == (None, "the job queue could not be read: boom")
    assert usage_fields(None) == {"usage": None, "usage_unknown": NO_RECORD}


# -- the watch: the ended job's record is read once, after its last state --------------------------------------------

LOG = logging.getLogger("test")
RECORD = {"job_id": 1, "status": "FAILED", "start_at": 100.0, "end_at": 580.0, "resources": "2x[GPU:8]"}


async def _watch(answers):
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.burst.watch import watch_job

    client = ScriptedClient(answers)
    event = await watch_job(
        SkyPilotHook(client=client), burst_handle(job_id=1), poll_interval=0, deadline=None, stream_logs=False, log=LOG
    )
    return event, [arg.path for _, arg in client.asked]


async def test_the_end_event_carries_the_usage_of_the_jobs_queue_record():
    event, asked = await _watch([{"1": "RUNNING"}, {"1": "FAILED"}, [RECORD]])
    assert asked == ["/job_status", "/job_status", "/queue"]  # one request more, after the last state
    assert event["status"] == "failed" and event_usage(event) == (JobUsage(16, 2, 480), "")


async def test_a_queue_that_cannot_be_read_leaves_the_usage_unknown_not_the_outcome():
    boom = sky.SkyPilotApiError("srun: Socket timed out", error_type="CommandError")
    event, _ = await _watch([{"1": "SUCCEEDED"}, boom])
    assert event["status"] == "success"
    assert event_usage(event) == (None, "the job queue could not be read: srun: Socket timed out")


def test_events_that_end_before_the_job_say_why_the_usage_is_unknown():
    from npa_airflow.burst.watch import ENDED_FIRST, NO_JOB_RAN, make_event

    assert event_usage(make_event("deadline", burst_handle(job_id=3), "late")) == (None, ENDED_FIRST)
    assert event_usage(make_event("failed", burst_handle(), "launch failed")) == (None, NO_JOB_RAN)


# -- the operator: XCom npa_usage and one log line, whatever the outcome, before any failure is raised ------------


@pytest.fixture
def logged(monkeypatch):
    from npa_airflow.burst.base import BurstLaunchOperatorBase

    logger, collected = collecting_logger("burst-usage")
    monkeypatch.setattr(BurstLaunchOperatorBase, "log", property(lambda self: logger))
    return collected


def _complete(answers, status, native, **usage):
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.burst.operators import BurstTorchrunOperator
    from npa_airflow.burst.watch import make_event

    op = BurstTorchrunOperator(task_id="train", image=None, nodes=2, accelerators="GPU:8", command="python t.py")
    op.get_hook = lambda: SkyPilotHook(client=ScriptedClient(answers))
    ctx = task_context("d")
    event = make_event(status, burst_handle(job_id=1), f"it ended {status}", native, **usage)
    try:
        return op.execute_complete(ctx, event), ctx["ti"].pushed
    except AirflowException as exc:
        return exc, ctx["ti"].pushed


def test_a_successful_job_reports_its_gpu_hours(logged):
    result, pushed = _complete([None], "success", "SUCCEEDED", **usage_fields(RECORD))
    assert not isinstance(result, Exception)
    assert pushed[xcom_keys.USAGE] == {"gpus": 16, "nodes": 2, "elapsed_seconds": 480, "gpu_hours": 16 * 480 / 3600}
    assert "GPU usage: 2.13 GPU-hours (16 GPUs on 2 nodes x 8 min 0 s)" in logged.lines


def test_a_failed_job_reports_its_gpu_hours_before_the_failure(logged):
    result, pushed = _complete([[], None], "failed", "FAILED", **usage_fields(RECORD))
    assert isinstance(result, AirflowFailException)
    assert pushed[xcom_keys.USAGE]["gpu_hours"] == pytest.approx(2.1333, abs=1e-3)
    assert "GPU usage: 2.13 GPU-hours (16 GPUs on 2 nodes x 8 min 0 s)" in logged.lines


def test_an_interrupted_wait_reports_an_unknown_usage(logged):
    from npa_airflow.burst.watch import ENDED_FIRST

    result, pushed = _complete([], "interrupted", "RUNNING")
    assert isinstance(result, AirflowException) and not isinstance(result, AirflowFailException)
    assert pushed[xcom_keys.USAGE] is None
    assert f"GPU usage: unknown ({ENDED_FIRST})" in logged.lines
