"""Parsers on output recorded from the real local Slurm 22.05 cluster (see samples/capture_samples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from npa_airflow.common.remote_errors import scancel_nothing_to_cancel, squeue_job_id_unknown
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm import commands as c
from npa_airflow.slurm.states import interpret_native_state

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_sbatch_parsable_samples():
    assert c.parse_sbatch_submit(sample("sbatch_parsable.txt")) == c.SubmitResult("28", None)
    assert c.parse_sbatch_submit(sample("sbatch_parsable_cluster.txt")) == c.SubmitResult("39", "npa")
    assert c.parse_sbatch_submit(sample("sbatch_parsable_array.txt")) == c.SubmitResult("42", None)


def test_sacct_sample_every_outcome():
    infos = c.parse_sacct(sample("sacct_states.txt"))
    summary = {k: (v.native_state, v.state, v.exit_code, v.signal) for k, v in infos.items()}
    assert summary["15"] == ("COMPLETED", JobState.COMPLETE, 0, 0)
    assert summary["16"] == ("FAILED", JobState.ERROR, 7, 0)
    assert summary["17"] == ("FAILED", JobState.ERROR, 0, 9)  # killed by SIGKILL
    assert summary["18"] == ("CANCELLED", JobState.CANCELED, 0, 0)  # "CANCELLED by 1001"
    assert summary["19"] == ("PENDING", JobState.PENDING, None, None)
    assert infos["19"].reason == "JobHeldUser"
    assert infos["19"].node_list is None  # "None assigned"
    assert summary["25"] == ("PENDING", JobState.PENDING, None, None)  # requeued: back in the queue
    # array 22: tasks by display id, by their own raw ids, and the whole array by its base id
    assert [infos[k].state for k in ("22_1", "22_2", "22_3")] == [JobState.COMPLETE] * 3
    assert infos["26"] is infos["22_1"]
    assert infos["22"].job_id == "22" and infos["22"].state is JobState.COMPLETE
    # het job 23: components and an aggregate over both
    assert infos["23+1"].node_list == "c2"
    assert (infos["23"].state, infos["23"].node_list) == (JobState.COMPLETE, "c1,c2")
    assert infos["15"].job_name == "npa-sample-ok"
    assert all(v.source == "sacct" for v in infos.values())


def test_sacct_requeue_duplicates_sample_last_record_wins():
    info = c.parse_sacct(sample("sacct_requeue_duplicates.txt"))["25"]
    assert (info.native_state, info.state) == ("CANCELLED", JobState.CANCELED)


def test_sacct_default_width_sample_truncated_state():
    # The seed's fallback: first word of the State column, "+" dropped.
    _job, state = sample("sacct_default_width.txt").split()
    assert state == "CANCELLED+"
    assert interpret_native_state(state) is JobState.CANCELED


def test_find_by_name_samples():
    """22.05 with Slurm's default AccountingStoreFlags: sacct has no comments, squeue always shows them (one holding
    the field separator); both give the submit time as epoch seconds."""
    by_sacct = c.parse_sacct(sample("sacct_find_by_name.txt"), c.FIND_SACCT_FIELDS)
    assert [(v.job_name, v.state, v.comment, v.submitted_at) for v in by_sacct.values()] == [
        ("npa-sample-find-ok", JobState.COMPLETE, None, 1796423060.0)
    ]
    by_squeue = c.parse_squeue(sample("squeue_find_by_name.txt"), c.FIND_SQUEUE_FIELDS)
    assert [(k, v.job_name, v.state, v.comment) for k, v in by_squeue.items()] == [
        ("10", "npa-sample-find-ok", JobState.COMPLETE, "npa1:-:0123456789abcdef01234567"),
        ("11", "npa-sample-find-held", JobState.PENDING, "made|by hand"),
    ]
    assert {v.submitted_at for v in by_squeue.values()} == {1796423060.0}
    with pytest.raises(NpaParseError):  # a line without the lookup's two extra fields is refused, never misread
        c.parse_squeue("11|11|PENDING|JobHeldUser||name\n", c.FIND_SQUEUE_FIELDS)


def test_squeue_sample():
    infos = c.parse_squeue(sample("squeue_states.txt"))
    assert infos["18"].state is JobState.CANCELED
    assert infos["16"].reason == "NonZeroExitCode"
    assert infos["16"].exit_code is None  # squeue has no exit code: sacct decides
    assert infos["25"].state is JobState.PENDING
    assert infos["27"] is infos["22_2"]
    assert infos["22"].state is JobState.COMPLETE
    assert infos["23"].node_list == "c1,c2"
    assert all(v.source == "squeue" for v in infos.values())


def test_squeue_pending_array_sample():
    infos = c.parse_squeue(sample("squeue_pending_array.txt"))
    assert infos["42_[1-3]"].state is JobState.PENDING
    assert infos["42"].state is JobState.PENDING
    assert infos["42"].reason == "JobHeldUser"


def test_squeue_invalid_single_id_sample():
    text = sample("squeue_invalid_id.txt")
    assert "rc=1" in text
    assert squeue_job_id_unknown(text)
    assert not squeue_job_id_unknown("slurm_load_jobs error: Unable to contact slurm controller")


@pytest.mark.parametrize("name", ["scancel_finished.txt", "scancel_invalid.txt"])
def test_scancel_of_finished_or_unknown_job_is_silent_success_on_22_05(name):
    assert sample(name).startswith("rc=0\n")


def test_cancel_means_finished_messages_of_other_slurm_versions():
    assert scancel_nothing_to_cancel(
        "scancel: error: Kill job error on job id 5: Job/step already completing or completed"
    )
    assert scancel_nothing_to_cancel("scancel: error: Kill job error on job id 5: Invalid job id specified")
    assert not scancel_nothing_to_cancel("scancel: error: Kill job error on job id 5: Access/permission denied")


def test_scontrol_samples():
    nodes = c.parse_scontrol_nodes(sample("scontrol_nodes.txt"))
    assert sorted(nodes) == ["c1", "c2", "g1", "g2"]
    assert nodes["g1"].partitions == ("gpu",)
    assert nodes["c2"].state == "MIXED"
    assert all(n.reason is None for n in nodes.values())
    parts = c.parse_partitions(sample("scontrol_partitions.txt"))
    assert parts["cpu"] == c.PartitionInfo("cpu", 480, True, "UP", "c[1-2]", total_nodes=2, max_nodes=None)
    assert parts["gpu"] == c.PartitionInfo("gpu", 240, False, "UP", "g[1-2]", total_nodes=2, max_nodes=None)
    assert [(nodes[n].gpus, nodes[n].real_memory_mb) for n in ("c1", "g1")] == [(0, 4096), (8, 4096)]


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("(null)", 0),
        ("gpu:8", 8),
        ("gpu:a100:4(S:0-1)", 4),  # type and socket binding, as scontrol prints them
        ("gpu:a100:2(S:0),gpu:v100:2(S:1)", 4),
        ("gpu:4,mps:400", 4),
        ("gpu", 1),
        ("mps:100", 0),
    ],
)
def test_gres_gpu_count(gres, gpus):
    assert c.parse_gres_gpus(gres) == gpus


def test_partition_max_nodes_is_read():
    line = sample("scontrol_partitions.txt").splitlines()[0].replace("MaxNodes=UNLIMITED", "MaxNodes=1")
    assert c.parse_partitions(line)["cpu"].max_nodes == 1
