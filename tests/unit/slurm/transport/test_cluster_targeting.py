"""Multi-cluster sites: one connection names one cluster, and every command about a job names the cluster its handle
records (sbatch's "id;cluster"), whatever the connection says; --clusters/-M in extra_sbatch is refused with advice.

The real two-cluster case (colliding job ids, on_kill) is tests/integration/test_multicluster.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaCancelFailed, NpaRemoteError, NpaValidationError
from npa_airflow.slurm.commands.records import BATCH_END, BATCH_MARK
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.hook import CommandResult, SlurmHook
from npa_airflow.slurm.submit.spec import SbatchSpec
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from npa_airflow.slurm.triggers import SlurmJobTrigger
from npa_airflow.slurm.watch.poller import SlurmPoller, get_poller
from tests.harness.cluster_double import LocalClusterDouble

SPEC = {"job_name": "npa-train-0123456789-t1", "command": "true", "log_dir": "/s/logs", "results_dir": "/s/r"}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--clusters=b"], "b"),
        (["--cluster=b"], "b"),
        (["-M", "b"], "b"),
        (["-Mb"], "b"),
        (["--qos=high", "--clusters", "b"], "b"),
        (["--clusters=a,b"], "<cluster>"),
    ],
)
def test_a_cluster_option_in_extra_sbatch_is_refused_with_the_connection_advice(extra, named):
    with pytest.raises(NpaValidationError) as refused:
        SbatchSpec(**SPEC, extra_sbatch=tuple(extra))
    message = str(refused.value)
    assert "extra_sbatch" in message and f'"cluster_name": "{named}"' in message and "slurm_conn_id" in message


def test_the_submit_operator_refuses_a_cluster_option_when_the_dag_is_parsed():
    from npa_airflow.slurm.operators import SlurmSubmitOperator

    with pytest.raises(NpaValidationError, match='"cluster_name": "b"'):
        SlurmSubmitOperator(task_id="t", command="true", extra_sbatch=["--clusters=b"])


@pytest.mark.parametrize("bad", ["a,b", "b;rm -rf /", "-M"])
def test_the_connection_names_exactly_one_valid_cluster(bad):
    conn = type("Conn", (), {"conn_id": "c", "host": "h", "port": 22, "login": "u", "password": None})()
    conn.extra_dejson = {"insecure_skip_host_key_check": True, "cluster_name": bad}
    with pytest.raises(NpaValidationError, match="cluster_name"):
        SlurmConnectionConfig.from_connection(conn)


# -- the hook names the cluster on every Slurm command ------------------------------------------------------


def recording_hook(cluster_name: str | None, handle_cluster: str | None = None) -> tuple[SlurmHook, list[str]]:
    """A hook for a job on `handle_cluster` under a connection naming `cluster_name`; it records what it runs."""
    cfg = SlurmConnectionConfig(conn_id="slurm_x", hosts=(("login1", 22),), user="npa", cluster_name=cluster_name)
    hook = SlurmHook("slurm_x", config=cfg).on_cluster(handle_cluster)
    sent: list[str] = []

    async def arun(argv, **kwargs):
        text = argv if isinstance(argv, str) else " ".join(argv)
        batched = re.findall(r"\(\n(.*?)\n\) >", text, re.S)  # commands.build_batch: record each command
        sent.extend(batched or [text])
        frames = "".join(f"{BATCH_MARK} {i} 0\n\n\n" for i in range(len(batched)))
        stdout = f"{frames}{BATCH_END}\n".encode() if batched else b""
        return CommandResult(stdout=stdout, stderr=b"", returncode=0, host="login1:22")

    hook.arun = arun  # type: ignore[method-assign]
    return hook, sent


async def every_job_command(hook: SlurmHook) -> None:
    await hook.ajob_states(["7"])
    with pytest.raises(NpaCancelFailed):  # the recorder's empty answers: neither squeue nor sacct knows job 7
        await hook.acancel("7")
    await hook.afind_jobs_by_name(["npa-x-0123456789-t1"])
    await hook.anodes()
    await hook.apartitions()


@pytest.mark.parametrize(
    ("connection_cluster", "handle_cluster", "flag"),
    [(None, None, None), ("npa", None, "-M npa"), (None, "b", "-M b"), ("npa", "b", "-M b")],
)
async def test_every_slurm_command_names_the_handles_cluster_else_the_connections(
    connection_cluster, handle_cluster, flag
):
    hook, sent = recording_hook(connection_cluster, handle_cluster)
    await every_job_command(hook)
    expected = ["sacct", "squeue", "scancel", "squeue", "sacct", "sacct", "squeue", "scontrol", "scontrol"]
    # The first tool each command runs (a squeue may check `squeue --help` for --only-job-state first).
    assert [re.search(r"\b(sacct|squeue|scancel|scontrol)\b", c).group(1) for c in sent] == expected  # type: ignore[union-attr]
    for command in sent:
        assert (flag in command) if flag else ("-M" not in command.split()), command
    assert await hook.atarget_cluster() == (handle_cluster or connection_cluster)


async def test_sbatch_names_the_hooks_cluster():
    hook, sent = recording_hook("npa", "b")
    with pytest.raises(NpaRemoteError):  # the recorder's empty answer is no staging output
        await hook.astage_and_submit([], "/s/job.sbatch")
    assert "sbatch --parsable -M b /s/job.sbatch" in sent[0]


# -- one poller per cluster; the trigger uses its job's -------------------------------------------------------


async def test_pollers_are_keyed_by_cluster_and_their_hooks_name_it(fast_poller):
    default, on_b = get_poller("slurm_x"), get_poller("slurm_x", cluster="b")
    assert default is not on_b and get_poller("slurm_x", cluster="b") is on_b
    assert SlurmPoller("slurm_x", cluster="b").hook.cluster == "b"
    assert SlurmPoller("slurm_x").hook.cluster is None


def handle_on(tmp_path: Path, cluster: str | None) -> dict:
    return SlurmJobHandle(
        conn_id="slurm_x",
        cluster=cluster,
        job_id="42",
        job_name="npa-dag-task-abc1234567-t1",
        login_host="127.0.0.1:2222",
        results_dir=str(tmp_path / "results"),
        stdout_path=str(tmp_path / "slurm-42.out"),
        stderr_path=str(tmp_path / "slurm-42.err"),
        try_number=1,
        submitted_at=time.time() - 3600,
    ).to_dict()


async def test_the_trigger_watches_and_cancels_on_its_jobs_cluster_only(tmp_path, fast_poller):
    """Job 42 runs on both clusters: the trigger of cluster b's job sees b's state and cancels b's job only."""
    first, second = LocalClusterDouble(), LocalClusterDouble()
    first.states["42"] = second.states["42"] = JobState.RUNNING
    get_poller("slurm_x", lambda _: first)
    get_poller("slurm_x", lambda _: second, cluster="b")
    trigger = SlurmJobTrigger(handle=handle_on(tmp_path, "b"), conn_id="slurm_x", poll_interval=0.01)
    trigger._log = logging.getLogger("npa.test.multicluster")
    trigger.deadline = time.time() + 0.5
    event = await asyncio.wait_for(anext(trigger.run()), 10)
    assert event.payload["status"] == "deadline"
    assert second.states["42"] is JobState.CANCELED and first.states["42"] is JobState.RUNNING
    assert second.state_calls and not first.state_calls


def test_the_operator_cancels_through_a_hook_on_the_handles_cluster():
    from npa_airflow.slurm.operators import SlurmSubmitOperator

    op = SlurmSubmitOperator(task_id="t", command="true", slurm_conn_id="slurm_x")
    hook = SlurmHook("slurm_x")
    op.get_hook = lambda: hook  # type: ignore[method-assign]
    on_b = SlurmJobHandle.from_dict({**handle_on(Path("/s"), "b")})
    assert op.job_hook(on_b).cluster == "b"
    assert op.job_hook(SlurmJobHandle.from_dict({**handle_on(Path("/s"), None)})) is hook


def test_the_sensor_polls_the_cluster_of_the_handle_it_was_given(monkeypatch):
    from npa_airflow.slurm.sensors import SlurmJobSensor

    asked: list[str | None] = []

    class Hook:
        def __init__(self, conn_id, cluster=None):
            self.cluster = cluster

        def job_states(self, ids):
            asked.append(self.cluster)
            return {}

    monkeypatch.setattr("npa_airflow.slurm.hook.SlurmHook", Hook)
    sensor = SlurmJobSensor(task_id="w", job=json.dumps(handle_on(Path("/s"), "b")), deferrable=False)
    assert sensor.poke({}) is False
    assert asked == ["b"]
