"""The remote-error predicates on output recorded from Slurm 22.05 and the SkyPilot API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.common import remote_errors as e

SLURM = Path(__file__).resolve().parents[1] / "slurm" / "samples"
BURST = Path(__file__).resolve().parents[1] / "burst" / "samples"

# Seen on the local cluster with slurmctld stopped or stalled (tests/reliability exercise the same states).
CONTROLLER_DOWN = [
    "slurm_load_partitions error: Socket timed out on send/recv operation",
    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
    "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to "
    "host:localhost:6819: Connection refused",
    "slurm_load_node error: Zero Bytes were transmitted or received",
]
REQUEST_WRONG = [
    "sbatch: error: Batch job submission failed: Invalid partition name specified",
    "sbatch: error: invalid partition specified: nosuch",
    "slurm_load_jobs error: Invalid job id specified",
]


@pytest.mark.parametrize("text", CONTROLLER_DOWN)
def test_controller_failures_are_told_apart_from_bad_requests(text):
    assert e.slurmctld_unreachable(text)
    assert e.sbatch_outcome_unknown(text)


@pytest.mark.parametrize("text", REQUEST_WRONG)
def test_a_bad_request_is_not_a_controller_failure(text):
    assert not e.slurmctld_unreachable(text)
    assert not e.sbatch_outcome_unknown(text)


def test_sbatch_that_timed_out_waiting_may_have_submitted():
    assert e.sbatch_outcome_unknown("sbatch: error: Batch job submission failed: Socket timed out on send/recv")
    assert e.sbatch_outcome_unknown("slurm_submit_batch_job: operation timed out")


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_squeue_single_unknown_id_recorded(version):
    recorded = (SLURM / version / "squeue_invalid_id.txt").read_text()
    assert e.squeue_job_id_unknown(recorded)
    assert not e.squeue_job_id_unknown(CONTROLLER_DOWN[1])


@pytest.mark.parametrize(
    "stderr",
    [
        "scancel: error: Kill job error on job id 5: Job/step already completing or completed",
        "scancel: error: Kill job error on job id 5: Invalid job id specified",
        "scancel: error: Kill job error on job id 5: Job/step already completing",
    ],
)
def test_scancel_of_an_ended_job_is_nothing_to_cancel(stderr):
    assert e.scancel_nothing_to_cancel(stderr)


def test_scancel_refused_for_other_reasons_is_an_error():
    assert not e.scancel_nothing_to_cancel("scancel: error: Kill job error on job id 5: Access/permission denied")
    assert not e.scancel_nothing_to_cancel(CONTROLLER_DOWN[1])


def test_skypilot_missing_cluster_recorded():
    recorded = json.loads((BURST / "queue_missing_cluster_get.json").read_text())
    result = sky.parse_get(recorded["status_code"], recorded["body"], "r1")
    assert e.skypilot_cluster_gone(result.error_type)
    assert e.skypilot_cluster_missing(result.error_type)
    assert e.skypilot_cluster_gone("ClusterNotUpError")
    assert not e.skypilot_cluster_missing("ClusterNotUpError")
    assert not e.skypilot_cluster_gone("CommandError")
    assert not e.skypilot_cluster_gone(None)


@pytest.mark.parametrize(
    "status,transient", [(429, True), (502, True), (503, True), (504, True), (500, False), (404, False), (200, False)]
)
def test_transient_http_status(status, transient):
    assert e.http_status_transient(status) is transient
