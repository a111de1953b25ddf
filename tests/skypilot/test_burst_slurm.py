"""End to end on SkyPilot's Slurm infra on the local cluster: a real 2-node launch, a real cancel.

Needs the local Slurm cluster (dev/cluster) and the SkyPilot API server with `dev/skypilot slurm`. The
first launch on a fresh machine installs SkyPilot's runtime on the cluster from PyPI (a minute or two).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.launcher import render_launcher
from npa_airflow.burst.task import BurstSpec, build_task, dag_yaml
from npa_airflow.burst.triggers import BurstJobTrigger
from tests.skypilot.conftest import run_dag_test, wait_no_slurm_jobs
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = pytest.mark.slow

DAGS = Path(__file__).resolve().parent / "dags"


def clusters(endpoint: str) -> dict:
    with sky.SkyPilotClient(endpoint) as client:
        return sky.parse_clusters(client.call(sky.build_status(client.identity)))


def test_two_node_torchrun_all_reduce_through_airflow(skypilot_server, skypilot_slurm, airflow_home):
    out = run_dag_test(airflow_home, DAGS / "burst_local_slurm.py", "npa_burst_slurm_allreduce", timeout=1200)
    log = out["log"]
    assert out["states"] == {"allreduce": "success"}, log[-8000:]
    assert "NCCL_PROBE_OK world_size=2 backend=gloo result=3" in log
    assert "npa-burst: node 0/2, master" in log and "npa-burst: node 1/2, master" in log
    assert "\x1b[" not in log
    assert "Cluster npa-e2e-allreduce torn down" in log
    assert "npa-e2e-allreduce" not in clusters(skypilot_server)
    assert wait_no_slurm_jobs("npa-e2e-allreduce") == []


async def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


async def _job_state(client, cluster: str, job_id: int) -> str | None:
    """The job's state; the shared cluster's scheduler sometimes times out, so ask up to three times."""
    for attempt in range(3):
        try:
            value = await client.call(sky.build_job_status(client.identity, cluster, [job_id]))
            return sky.parse_job_status(value, job_id)
        except sky.SkyPilotApiError:
            if attempt == 2:
                raise
            await asyncio.sleep(3)
    return None


async def test_kill_cancels_and_tears_down_but_a_triggerer_restart_does_not(
    skypilot_server, skypilot_slurm, monkeypatch
):
    supervisor = install_supervisor(monkeypatch, "deferred")
    cluster = "npa-e2e-cancel"
    spec = BurstSpec(
        image=None,
        nodes=2,
        accelerators="GPU:1",
        command="python3 -c 'import time; time.sleep(900)'",
        name="cancel-me",
        master_port=29723,
        infra=skypilot_slurm,
    )
    task = build_task(spec, render_launcher(spec))
    async with sky.AsyncSkyPilotClient(skypilot_server) as client:
        request_id = await client.submit(sky.build_launch(client.identity, dag_yaml(task), cluster))
        handle = BurstJobHandle(
            conn_id="skypilot_default",
            endpoint=skypilot_server,
            cluster=cluster,
            name=spec.name,
            request_id=request_id,
            submitted_at=time.time(),
        )
        kwargs = BurstJobTrigger(handle=handle.to_dict(), poll_interval=2, nodes=2).serialize()[1]

        first = run_for_task_instance(BurstJobTrigger(**kwargs))
        run = asyncio.ensure_future(first.run().__anext__())

        async def job_running():
            if first._current.job_id is None:
                return None
            return await _job_state(client, cluster, first._current.job_id) == "RUNNING"

        try:
            await _wait_for(job_running, 600, "the job to run")
        finally:
            # A triggerer restart: the trigger task is cancelled, on_kill is not called.
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
            await first.cleanup()
        job_id = first._current.job_id
        assert await _job_state(client, cluster, job_id) == "RUNNING", "a triggerer restart must not cancel the job"

        # The trigger resumes from its serialized kwargs (another triggerer): the first one's on_kill now finds
        # a newer claim of the same try and cancels nothing.
        second = run_for_task_instance(BurstJobTrigger(**kwargs))
        resumed = asyncio.ensure_future(second.run().__anext__())
        await _wait_for(lambda: asyncio.sleep(0, result=second._current.job_id == job_id), 120, "the resumed trigger")
        await asyncio.wait_for(first.on_kill(), 30)
        assert await _job_state(client, cluster, job_id) == "RUNNING", "a moved trigger must not cancel the job"
        # Then the user marks the task failed.
        supervisor.state = "failed"
        await asyncio.wait_for(second.on_kill(), 30)  # within the triggerer's on_kill bound
        resumed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await resumed
        await second.on_kill()  # idempotent: a second kill does nothing

    # on_kill only submits the cancel and teardown; the API server carries them out.
    await _wait_for(lambda: asyncio.sleep(0, result=cluster not in clusters(skypilot_server)), 300, "the teardown")
    assert wait_no_slurm_jobs(cluster) == []


EXAMPLES = Path(__file__).resolve().parents[2] / "dags_examples"


@pytest.mark.parametrize(
    "example, dag_id, expected",
    [
        ("burst_torchrun.py", "burst_torchrun", "NCCL_PROBE_OK world_size=2 backend=gloo result=3"),
        ("burst_submit_yaml.py", "burst_submit_yaml", "burst-smoke node 1 of 2: run manual__"),
    ],
)
def test_examples_run_on_the_local_stack(skypilot_server, skypilot_slurm, airflow_home, example, dag_id, expected):
    out = run_dag_test(airflow_home, EXAMPLES / example, dag_id, timeout=1200, AIRFLOW__CORE__DAGS_FOLDER=str(EXAMPLES))
    assert set(out["states"].values()) == {"success"}, out["log"][-8000:]
    assert expected in out["log"]
    # Every node's ranks finished: no agent reports a failed worker. A non-master agent may still log "Error waiting
    # on exit barrier" after the job succeeded, when the master's agent closed the store it hosts as the barrier
    # completed (torch's own race, pytorch/pytorch#69520; 1 run in about 10 here): the store went away at once. A
    # rank that missed the barrier would show as a wait of its whole timeout (300 s).
    log = out["log"]
    assert "ChildFailedError" not in log and "Failures:" not in log, log[-8000:]
    waits = [float(s) for s in re.findall(r"Error waiting on exit barrier\. Elapsed: ([0-9.]+) seconds", log)]
    assert all(w < 60 for w in waits) and (not waits or "Connection was likely closed" in log), log[-8000:]
    assert not [name for name in clusters(skypilot_server) if dag_id.replace("_", "-") in name]


def test_deadline_cancels_tears_down_and_fails_clearly(skypilot_server, skypilot_slurm, airflow_home):
    out = run_dag_test(airflow_home, DAGS / "burst_local_slurm.py", "npa_burst_slurm_deadline", timeout=1200)
    log = out["log"]
    assert out["states"] == {"sleeper": "failed"}, log[-8000:]
    assert "max_wait=0:02:00 passed since the launch, so it was cancelled (teardown=down)" in log
    assert "Cluster npa-e2e-deadline torn down" in log
    assert "npa-e2e-deadline" not in clusters(skypilot_server)
    assert wait_no_slurm_jobs("npa-e2e-deadline") == []
