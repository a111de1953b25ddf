"""The Compute page's GPU-hours: a running job's from its state, an ended task's from XCom npa_usage (never trusted),
unknown shown as unknown (never 0), the segment of a job's name, and the total per DAG run."""

from __future__ import annotations

import math

import pytest

from npa_airflow.common.naming import segment_of
from npa_airflow.compute import rows as r
from npa_airflow.compute import usage as u
from npa_airflow.slurm.commands import JobUsage

USAGE = JobUsage(gpus=16, nodes=2, elapsed_seconds=900).to_dict()  # 4.0 GPU-hours
REPORT = {
    "gpus": 16,
    "nodes": 2,
    "elapsed_seconds": 2700,
    "gpu_hours": 12.0,  # the try's total: every segment
    "segments": [{"segment": 1, "job_id": "100", **USAGE}, {"segment": 2, "job_id": "101", "unknown": "no record"}],
}


def task(job_name="npa-train-0123456789-t1", *, run="run 1", reported=None, job_id="101"):
    handle = {"conn_id": "slurm_default", "cluster": None, "job_id": job_id, "job_name": job_name}
    rendered = {"sbatch_script": "#SBATCH --nodes=2\n#SBATCH --gres=gpu:8\n"}
    return r.LiveTask("d", run, "train", -1, 1, "deferred", {"slurm_job": handle}, rendered, "v1", reported or {})


def row(status, **kwargs):
    return r.slurm_row(task(**kwargs), status, {}, now=0.0)


def test_a_running_job_shows_the_gpu_hours_its_state_reports():
    shown = row(r.JobStatus("RUNNING", "RUNNING", None, "g[1-2]", USAGE))
    assert (shown.gpu_hours, shown.gpu_hours_from, shown.gpu_hours_unknown) == (4.0, u.FROM_CLUSTER, None)
    assert shown.to_json()["gpu_hours"] == 4.0


@pytest.mark.parametrize(
    ("status", "why"),
    [
        (r.JobStatus("RUNNING", "RUNNING", None, "g1"), u.NO_SLURM_RECORD),  # squeue/scontrol, no accounting
        (r.JobStatus("RUNNING", "RUNNING", None, "g1", {"gpu_hours": "4"}), u.NO_SLURM_RECORD),
        (None, u.NO_ANSWER),
    ],
)
def test_a_state_without_usage_is_unknown_not_zero(status, why):
    shown = row(status)
    assert (shown.gpu_hours, shown.gpu_hours_unknown, shown.gpu_hours_from) == (None, why, None)


def test_a_pending_job_has_used_nothing_yet():
    shown = row(r.JobStatus("PENDING", "PENDING", "Resources", None, JobUsage(0, 0, 0).to_dict()))
    assert shown.gpu_hours == 0.0 and shown.gpu_hours_from == u.FROM_CLUSTER


@pytest.mark.parametrize("status", [None, r.JobStatus("COMPLETE", "COMPLETED", None, None, USAGE)])
def test_an_ended_task_shows_the_total_it_reported(status):
    """The report covers every segment of the try: it wins over the last job's own record."""
    shown = row(status, reported={"npa_usage": REPORT})
    assert (shown.gpu_hours, shown.gpu_hours_from) == (12.0, u.FROM_TASK)


def test_a_running_later_segment_adds_what_the_task_reported_of_the_earlier_ones():
    """The worker pushes the run's total as each segment ends: the page adds the running segment's own."""
    running = r.JobStatus("RUNNING", "RUNNING", None, "g1", USAGE)
    shown = row(running, job_name="npa-train-0123456789-s3-t1", reported={"npa_usage": REPORT})
    assert (shown.gpu_hours, shown.gpu_hours_from) == (16.0, u.FROM_CLUSTER)
    unreported = row(running, job_name="npa-train-0123456789-s3-t1")
    assert (unreported.gpu_hours, unreported.gpu_hours_unknown) == (None, u.EARLIER_SEGMENTS)


def test_a_report_does_not_replace_a_running_jobs_state():
    shown = row(r.JobStatus("RUNNING", "RUNNING", None, "g1", USAGE), reported={"npa_usage": REPORT})
    assert (shown.gpu_hours, shown.gpu_hours_from) == (4.0, u.FROM_CLUSTER)


@pytest.mark.parametrize(
    "value",
    [
        "12.0",
        12.0,
        True,
        [],
        {"gpus": 8, "elapsed_seconds": 3600},  # no gpu_hours
        {"gpu_hours": "12"},
        {"gpu_hours": True},
        {"gpu_hours": -1.0},
        {"gpu_hours": math.nan},
        {"gpu_hours": math.inf},
        {"gpu_hours": None},
    ],
)
def test_a_malformed_report_is_unknown_and_breaks_nothing(value):
    shown = row(r.JobStatus("ERROR", "FAILED", None, None, USAGE), reported={"npa_usage": value})
    assert (shown.gpu_hours, shown.gpu_hours_unknown, shown.gpu_hours_from) == (None, u.MALFORMED, None)


def test_a_task_that_reported_none_is_unknown():
    shown = row(None, reported={"npa_usage": None})
    assert (shown.gpu_hours, shown.gpu_hours_unknown) == (None, u.REPORTED_NONE)


def test_an_ignored_handle_and_a_burst_job_say_why_their_hours_are_unknown():
    ignored = r.untrusted_row(task(), r.SLURM, "malformed", now=0.0)
    assert (ignored.gpu_hours, ignored.gpu_hours_unknown) == (None, u.IGNORED)
    handle = {"conn_id": "sky", "cluster": "c", "job_id": 3, "name": "npa-train-0123456789-s2-t1"}
    burst = r.LiveTask("d", "r", "train", -1, 1, "deferred", {"burst_job": handle}, {}, None, {"npa_usage": REPORT})
    running = r.burst_row(burst, r.JobStatus("RUNNING", "RUNNING"), now=0.0)
    assert (running.gpu_hours, running.gpu_hours_unknown, running.segment) == (None, u.NO_BURST_RECORD, 2)
    ended = r.burst_row(burst, r.JobStatus("COMPLETE", "SUCCEEDED"), now=0.0)
    assert (ended.gpu_hours, ended.gpu_hours_from) == (12.0, u.FROM_TASK)


@pytest.mark.parametrize(
    ("name", "segment"),
    [
        ("npa-train-0123456789-t1", 1),
        ("npa-train-0123456789-s2-t1", 2),
        ("npa-train-0123456789-s17-t3", 17),
        ("npa-s3-train-0123456789-t1", 1),  # "-s3" of the slug, not before the try suffix
        ("npa-train-0123456789-s12345-t1", 1),  # more than 4 digits is no segment suffix
        (None, 1),
    ],
)
def test_a_job_row_shows_the_segment_its_name_carries(name, segment):
    assert segment_of(name) == segment
    assert row(None, job_name=name).segment == segment


def _rows():
    running = r.JobStatus("RUNNING", "RUNNING", None, "g1", USAGE)
    return [
        row(running, run="a", job_id="1"),
        row(None, run="a", job_id="2", reported={"npa_usage": REPORT}),
        row(running, run="b", job_id="3"),
        row(None, run="b", job_id="4"),  # unknown: the cluster did not answer
        row(r.JobStatus("RUNNING", "RUNNING"), run="c", job_id="5"),
    ]


def test_a_run_total_sums_the_known_hours_and_counts_the_unknown_ones():
    assert u.run_totals(_rows()) == [
        {"dag_id": "d", "run_id": "a", "jobs": 2, "gpu_hours": 16.0, "unknown": 0},
        {"dag_id": "d", "run_id": "b", "jobs": 2, "gpu_hours": 4.0, "unknown": 1},
        {"dag_id": "d", "run_id": "c", "jobs": 1, "gpu_hours": None, "unknown": 1},  # not 0: nothing known
    ]
