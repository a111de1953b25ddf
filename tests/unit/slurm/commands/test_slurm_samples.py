"""Parsers on output recorded from the real local clusters, one folder per Slurm release (samples/22.05,
samples/24.11; see samples/capture_samples.py). Every test runs on each release; where the releases answer
differently, the test says what each one printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npa_airflow.common.remote_errors import scancel_nothing_to_cancel, squeue_job_id_unknown
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm import commands as c
from npa_airflow.slurm.commands.states import interpret_native_state

SAMPLES = Path(__file__).parents[1] / "samples"
VERSIONS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and re.fullmatch(r"\d+\.\d+", p.name))


def test_both_tested_releases_are_recorded():
    assert VERSIONS == ["22.05", "24.11"]


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return request.param


def sample(version: str, name: str) -> str:
    return (SAMPLES / version / name).read_text()


def raw_ids(text: str, raw_first: bool) -> dict[str, str]:
    """{display id: raw id} of a recorded sacct (JobIDRaw, JobID first) or squeue (%i, %A first) output."""
    rows = [line.split("|")[:2] for line in text.splitlines() if line.strip()]
    return {display: raw for raw, display in rows} if raw_first else dict(rows)


def named(infos: dict[str, c.SlurmJobInfo], name: str) -> list[c.SlurmJobInfo]:
    """The records (by their display id, each once) of the sample job `npa-sample-<name>`."""
    return [v for k, v in infos.items() if v.job_name == f"npa-sample-{name}" and k == v.job_id]


def one(infos: dict[str, c.SlurmJobInfo], name: str) -> c.SlurmJobInfo:
    (info,) = named(infos, name)
    return info


def test_sbatch_parsable_samples(version):
    for name, cluster in (("sbatch_parsable.txt", None), ("sbatch_parsable_array.txt", None)):
        submitted = c.parse_sbatch_submit(sample(version, name))
        assert submitted.job_id.isdigit() and submitted.cluster == cluster
    submitted = c.parse_sbatch_submit(sample(version, "sbatch_parsable_cluster.txt"))
    assert submitted.job_id.isdigit() and submitted.cluster == "npa"


# What accounting says of a pending job's reason: 24.11 prints None for every one; 22.05 stored some.
SACCT_PENDING_REASON = {
    "22.05": {"held": "JobHeldUser", "requeue": "BeginTime"},
    "24.11": {"held": None, "requeue": None},
}
# squeue's reason for a job killed by a signal.
SQUEUE_SIGNAL_REASON = {"22.05": "JobLaunchFailure", "24.11": "RaisedSignal:9(Killed)"}


def test_sacct_sample_every_outcome(version):
    text = sample(version, "sacct_states.txt")
    infos = c.parse_sacct(text)
    summary = {name: (i.native_state, i.state, i.exit_code, i.signal) for name in ("ok", "exit7", "signal", "cancel")
               for i in [one(infos, name)]}  # fmt: skip
    assert summary == {
        "ok": ("COMPLETED", JobState.COMPLETE, 0, 0),
        "exit7": ("FAILED", JobState.ERROR, 7, 0),
        "signal": ("FAILED", JobState.ERROR, 0, 9),  # killed by SIGKILL
        "cancel": ("CANCELLED", JobState.CANCELED, 0, 0),  # "CANCELLED by 1001"
    }
    held, requeued = one(infos, "held"), one(infos, "requeue")
    assert (held.native_state, held.state, held.exit_code, held.node_list) == ("PENDING", JobState.PENDING, None, None)
    assert (requeued.state, requeued.exit_code) == (JobState.PENDING, None)  # requeued: back in the queue
    assert {"held": held.reason, "requeue": requeued.reason} == SACCT_PENDING_REASON[version]
    # the array: tasks by display id, by their own raw ids, and the whole array by its base id
    array = [a for a in named(infos, "array") if "_" in a.job_id]
    base = array[0].job_id.split("_")[0]
    assert sorted(a.job_id for a in array) == [f"{base}_{i}" for i in (1, 2, 3)]
    assert all(a.state is JobState.COMPLETE for a in array)
    assert infos[raw_ids(text, raw_first=True)[f"{base}_1"]] is infos[f"{base}_1"]
    assert infos[base].job_id == base and infos[base].state is JobState.COMPLETE
    # the het job: components and an aggregate over both
    het = [h for h in named(infos, "het") if "+" in h.job_id]
    base = het[0].job_id.split("+")[0]
    assert sorted(h.job_id for h in het) == [f"{base}+0", f"{base}+1"]
    assert (infos[base].state, infos[base].node_list) == (JobState.COMPLETE, "c1,c2")
    assert all(v.source == "sacct" for v in infos.values())


def test_sacct_sample_usage(version):
    """What each job was allocated and how long it ran: the GPU job's 2 nodes x 8 GPUs, a CPU job's node, nothing
    for a job still pending (empty AllocTRES), none for an array asked for by its base id."""
    infos = c.parse_sacct(sample(version, "sacct_states.txt"))
    gpus = one(infos, "gpus").usage
    assert (gpus.gpus, gpus.nodes) == (16, 2) and gpus.elapsed_seconds > 0
    assert gpus.gpu_hours == 16 * gpus.elapsed_seconds / 3600
    ok = one(infos, "ok").usage
    assert (ok.gpus, ok.nodes) == (0, 1)
    assert one(infos, "held").usage == c.JobUsage(0, 0, 0)  # never started
    requeued = one(infos, "requeue").usage
    assert requeued is not None and (requeued.gpus, requeued.nodes) == (0, 0)  # pending again, nothing allocated
    array = [a for a in named(infos, "array") if "_" in a.job_id]
    assert all(a.usage is not None and a.usage.nodes == 1 for a in array)
    assert infos[array[0].job_id.split("_")[0]].usage is None


def test_sacct_requeue_duplicates_sample_last_record_wins(version):
    text = sample(version, "sacct_requeue_duplicates.txt")
    assert [line.split("|")[2] for line in text.splitlines()] == ["REQUEUED", "CANCELLED by 1001"]
    info = one(c.parse_sacct(text), "requeue")
    assert (info.native_state, info.state) == ("CANCELLED", JobState.CANCELED)
    # The run before the requeue is in the first record only, which sacct prints with --duplicates: the state
    # query (without it) counts the last run's time, never the sum.
    last_elapsed = int(text.splitlines()[-1].split("|")[6])
    assert info.usage is not None and info.usage.elapsed_seconds == last_elapsed


@pytest.mark.parametrize("moment", ["ending", "ended"])
@pytest.mark.parametrize("kind", ["requeue", "cancel"])
def test_a_preempted_job_ends_only_when_it_was_not_requeued(version, kind, moment):
    """What the poller makes of a preemption (samples/capture_samples.py preempt): while the preemption kills the job
    accounting says PREEMPTED and squeue COMPLETING, requeued or not; squeue's answer keeps the job live. Then a
    --requeue job is PENDING in both, and one without requeue PREEMPTED in both: it ended, an error."""
    accounted = c.parse_sacct(sample(version, f"preempted_{kind}_{moment}_sacct.txt"))
    live = c.parse_squeue(sample(version, f"preempted_{kind}_{moment}_squeue.txt"))
    (job_id,) = accounted
    asked = [job_id] if c.may_run_again(accounted[job_id]) else []
    state = c.merge_live_states(accounted, live, asked)[job_id]
    if kind == "cancel" and moment == "ended":
        assert (state.state, state.native_state) == (JobState.ERROR, "PREEMPTED")
    else:
        assert not state.state.is_terminal, state
    if moment == "ending" and accounted[job_id].native_state == "PREEMPTED":
        assert asked and live[job_id].native_state == "COMPLETING"


def test_sacct_default_width_sample_truncated_state(version):
    # The seed's fallback: first word of the State column, "+" dropped.
    _job, state = sample(version, "sacct_default_width.txt").split()
    assert state == "CANCELLED+"
    assert interpret_native_state(state) is JobState.CANCELED


def test_find_by_name_samples(version):
    """Slurm's default AccountingStoreFlags: sacct has no comments, squeue always shows them (one holding the
    field separator); both give the submit time as epoch seconds."""
    by_sacct = c.parse_sacct(sample(version, "sacct_find_by_name.txt"), c.FIND_SACCT_FIELDS)
    assert [(v.job_name, v.state, v.comment, v.usage) for v in by_sacct.values()] == [
        ("npa-sample-find-ok", JobState.COMPLETE, None, None)  # a lookup by name reads no usage
    ]
    by_squeue = c.parse_squeue(sample(version, "squeue_find_by_name.txt"), c.FIND_SQUEUE_FIELDS)
    assert [(v.job_name, v.state, v.comment) for v in by_squeue.values()] == [
        ("npa-sample-find-ok", JobState.COMPLETE, "npa1:-:0123456789abcdef01234567"),
        ("npa-sample-find-held", JobState.PENDING, "made|by hand"),
    ]
    (submitted,) = {v.submitted_at for v in [*by_sacct.values(), *by_squeue.values()]}
    assert submitted is not None and submitted > 1.7e9
    with pytest.raises(NpaParseError):  # a line without the lookup's two extra fields is refused, never misread
        c.parse_squeue("11|11|PENDING|JobHeldUser||name\n", c.FIND_SQUEUE_FIELDS)


def test_squeue_sample(version):
    text = sample(version, "squeue_states.txt")
    infos = c.parse_squeue(text)
    assert one(infos, "cancel").state is JobState.CANCELED
    failed = one(infos, "exit7")
    assert (failed.reason, failed.exit_code) == ("NonZeroExitCode", None)  # squeue has no exit code: sacct decides
    assert one(infos, "signal").reason == SQUEUE_SIGNAL_REASON[version]
    assert (one(infos, "held").reason, one(infos, "requeue").reason) == ("JobHeldUser", "BeginTime")
    assert one(infos, "requeue").state is JobState.PENDING
    base = min(a.job_id for a in named(infos, "array")).split("_")[0]
    assert infos[raw_ids(text, raw_first=False)[f"{base}_2"]] is infos[f"{base}_2"]
    assert infos[base].state is JobState.COMPLETE
    het = min(h.job_id for h in named(infos, "het")).split("+")[0]
    assert infos[het].node_list == "c1,c2"
    assert all(v.source == "squeue" for v in infos.values())


def test_squeue_only_job_state_sample(version):
    """24.11 has --only-job-state: the same states as the full squeue, without reasons, nodes or names; 22.05 does
    not know the option."""
    text = sample(version, "squeue_only_states.txt")
    if version == "22.05":
        assert text.startswith("rc=1\n") and "unrecognized option '--only-job-state'" in text
        return
    only, full = c.parse_squeue(text), c.parse_squeue(sample(version, "squeue_states.txt"))
    assert {k: v.native_state for k, v in only.items()} == {k: v.native_state for k, v in full.items()}
    assert {(v.reason, v.node_list, v.job_name) for v in only.values()} == {(None, None, None)}


def test_squeue_pending_array_sample(version):
    infos = c.parse_squeue(sample(version, "squeue_pending_array.txt"))
    (display,) = [k for k in infos if "[" in k]
    base = display.split("_")[0]
    assert display == f"{base}_[1-3]" and infos[display].state is JobState.PENDING
    assert infos[base].state is JobState.PENDING
    assert infos[base].reason == "JobHeldUser"


def test_squeue_invalid_single_id_sample(version):
    text = sample(version, "squeue_invalid_id.txt")
    assert "rc=1" in text
    assert squeue_job_id_unknown(text)
    assert not squeue_job_id_unknown("slurm_load_jobs error: Unable to contact slurm controller")


@pytest.mark.parametrize("name", ["scancel_finished.txt", "scancel_invalid.txt"])
def test_scancel_of_finished_or_unknown_job_is_silent_success(version, name):
    assert sample(version, name) == "rc=0\nstdout=''\nstderr=''\n"


def test_cancel_means_finished_messages_of_other_slurm_versions():
    assert scancel_nothing_to_cancel(
        "scancel: error: Kill job error on job id 5: Job/step already completing or completed"
    )
    assert scancel_nothing_to_cancel("scancel: error: Kill job error on job id 5: Invalid job id specified")
    assert not scancel_nothing_to_cancel("scancel: error: Kill job error on job id 5: Access/permission denied")


# RealMemory of the cpu nodes: the bed's template gave them 4096 MB when 22.05 was recorded, 8192 MB since.
CPU_NODE_MEMORY = {"22.05": 8192, "24.11": 8192}


def test_scontrol_samples(version):
    nodes = c.parse_scontrol_nodes(sample(version, "scontrol_nodes.txt"))
    assert sorted(nodes) == ["c1", "c2", "g1", "g2"]
    assert nodes["g1"].partitions == ("gpu",)
    assert {n.state for n in nodes.values()} <= {"IDLE", "MIXED"}
    assert all(n.reason is None for n in nodes.values())
    parts = c.parse_partitions(sample(version, "scontrol_partitions.txt"))
    assert parts["cpu"] == c.PartitionInfo("cpu", 480, True, "UP", "c[1-2]", total_nodes=2, max_nodes=None)
    assert parts["gpu"] == c.PartitionInfo("gpu", 240, False, "UP", "g[1-2]", total_nodes=2, max_nodes=None)
    assert [(nodes[n].gpus, nodes[n].real_memory_mb) for n in ("c1", "g1")] == [
        (0, CPU_NODE_MEMORY[version]),
        (8, 4096),
    ]


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


def test_partition_max_nodes_is_read(version):
    line = sample(version, "scontrol_partitions.txt").splitlines()[0].replace("MaxNodes=UNLIMITED", "MaxNodes=1")
    assert c.parse_partitions(line)["cpu"].max_nodes == 1
