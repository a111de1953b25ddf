"""Burst lifecycle against the real SkyPilot API server and its Slurm infra on the local cluster: a killed
worker or an API outage never doubles or tears down a cluster, and a failed job is classified as the Slurm side
classifies it. Each test drives the operator the way Airflow does (execute, the trigger, execute_complete) with
one try after another of one task instance, and reads what exists from the server itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.burst import client as sky
from tests.harness.airflow_tasks import job_name as job_name_for
from tests.harness.airflow_tasks import submit_deferred, task_context
from tests.harness.tcp_proxy import TcpProxy
from tests.skypilot.conftest import SLURM_INFRA, wait_no_slurm_jobs

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TASK_YAML = Path(__file__).resolve().parent / "dags" / "lifecycle.yaml"


def burst_operator(ticks: int = 20, exit_code: int = 0, **kwargs):
    """A 1-node job on the local Slurm infra that prints ``ticks`` lines, one a second, then exits."""
    from npa_airflow.burst.operators import BurstSubmitYamlOperator

    variables = {"NPA_INFRA": kwargs.pop("infra", SLURM_INFRA), "NPA_TICKS": ticks, "NPA_EXIT": exit_code}
    defaults = dict(task_id="train", yaml_path=str(TASK_YAML), vars=variables, poll_interval=2, max_wait=900)
    defaults.update(kwargs)
    return BurstSubmitYamlOperator(**defaults)


def try_name(dag_id: str, run_id: str, try_number: int) -> str:
    return job_name_for(dag_id, "train", run_id, -1, try_number)


def server_clusters(endpoint: str) -> dict:
    with sky.SkyPilotClient(endpoint) as client:
        return sky.parse_clusters(client.call(sky.build_status(client.identity)))


def launches_for(endpoint: str, cluster: str) -> list[sky.RequestResult]:
    """The launch requests the server holds for ``cluster`` (``GET /api/status?cluster_name=``)."""
    params = {"cluster_name": cluster, "all_status": "true"}
    with sky.SkyPilotClient(endpoint) as client:
        response = client.send(sky.ApiRequest("GET", "/api/status", params=params))
    requests = sky.parse_request_statuses(response.status_code, response.json()).values()
    return [r for r in requests if r.name == "sky.launch"]


def job_state(endpoint: str, cluster: str, job_id: int) -> str | None:
    with sky.SkyPilotClient(endpoint) as client:
        return sky.parse_job_status(client.call(sky.build_job_status(client.identity, cluster, [job_id])), job_id)


async def run_trigger(trigger, timeout: float) -> dict:
    event = await asyncio.wait_for(trigger.run().__anext__(), timeout)
    return event.payload


def cluster_requests(endpoint: str, cluster: str) -> list[dict]:
    """Every request the server holds for ``cluster``, as it lists them (name, status, created_at, finished_at)."""
    params = {"cluster_name": cluster, "all_status": "true"}
    with sky.SkyPilotClient(endpoint) as client:
        return client.send(sky.ApiRequest("GET", "/api/status", params=params)).json()


def kill_worker_after_its_launch(endpoint: str, dag_id: str, run_id: str, tmp_path: Path) -> None:
    """Run try 1 (``deferrable=False``) in its own process and SIGKILL it once its launch request exists."""
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path[:0] = [{str(REPO)!r}]
            from tests.harness.airflow_tasks import task_context
            from tests.skypilot.test_burst_lifecycle import burst_operator
            op = burst_operator(deferrable=False)
            op.execute(task_context({dag_id!r}, try_number=1, run_id={run_id!r}))
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(worker)], env=dict(os.environ), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not launches_for(endpoint, try_name(dag_id, run_id, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the worker never sent its launch"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no on_kill, no cleanup: the launch goes on
        proc.wait()


def test_worker_killed_after_the_launch_request_the_retry_adopts_it(skypilot_server, skypilot_slurm, tmp_path):
    """SIGKILL of the worker right after it sent the launch (no on_kill runs): try 2 finds try 1's launch by its
    name and waits for it; exactly one cluster ever exists, and it is taken down at the end."""
    dag_id, run_id = f"npa_burst_kill_{uuid.uuid4().hex[:6]}", "manual__kill"
    first, second = try_name(dag_id, run_id, 1), try_name(dag_id, run_id, 2)
    kill_worker_after_its_launch(skypilot_server, dag_id, run_id, tmp_path)

    handle = burst_operator(deferrable=False).execute(task_context(dag_id, 2, run_id))

    names = [name for name in server_clusters(skypilot_server) if name in (first, second)]
    assert names == [], f"clusters left behind: {names}"
    assert launches_for(skypilot_server, second) == [], "try 2 launched a second cluster"
    assert len(launches_for(skypilot_server, first)) == 1
    assert (handle["cluster"], handle["try_name"]) == (first, first)
    assert wait_no_slurm_jobs(first) == []


def test_worker_killed_after_the_launch_request_the_retry_cancels_it_first(skypilot_server, skypilot_slurm, tmp_path):
    """The same kill with ``on_previous_try="cancel"``: try 1's launch is cancelled and its cluster is down before
    try 2's launch is even sent, so there is never more than one cluster; none is left at the end."""
    dag_id, run_id = f"npa_burst_cancel_{uuid.uuid4().hex[:6]}", "manual__cancel"
    first, second = try_name(dag_id, run_id, 1), try_name(dag_id, run_id, 2)
    kill_worker_after_its_launch(skypilot_server, dag_id, run_id, tmp_path)

    handle = burst_operator(deferrable=False, on_previous_try="cancel").execute(task_context(dag_id, 2, run_id))

    assert [name for name in server_clusters(skypilot_server) if name in (first, second)] == []
    assert (handle["cluster"], handle["try_name"]) == (second, second)
    first_requests = cluster_requests(skypilot_server, first)
    (first_launch,) = [r for r in first_requests if r["name"] == "sky.launch"]
    downs = [r for r in first_requests if r["name"] == "sky.down" and r["status"] == "SUCCEEDED"]
    (second_launch,) = [r for r in cluster_requests(skypilot_server, second) if r["name"] == "sky.launch"]
    assert first_launch["status"] in ("CANCELLED", "SUCCEEDED"), first_launch["status"]
    if downs:  # try 1's cluster existed: it was down before try 2's launch was sent
        assert min(d["finished_at"] for d in downs) < second_launch["created_at"]
    else:  # the launch was cancelled before it made a cluster (the operator found it "already gone")
        assert first_launch["status"] == "CANCELLED", first_requests
        assert first_launch["finished_at"] < second_launch["created_at"], (first_launch, second_launch)
    assert wait_no_slurm_jobs(first) == [] and wait_no_slurm_jobs(second) == []


async def test_an_api_outage_past_its_budget_leaves_the_job_for_the_next_try(
    skypilot_server, skypilot_slurm, monkeypatch
):
    """The API server unreachable (through a cut proxy) longer than the outage budget while the job runs: the
    try fails for a retry and leaves job and cluster running; try 2 adopts them, rides out a connection that
    cannot be read when its trigger starts, and takes the cluster down after the job's success."""
    from npa_airflow.burst import watch

    proxy = TcpProxy("127.0.0.1", int(skypilot_server.rsplit(":", 1)[1])).start()
    conn = json.dumps({"conn_type": "skypilot", "host": proxy.url})
    monkeypatch.setenv("AIRFLOW_CONN_SKYPILOT_DEFAULT", conn)
    monkeypatch.setattr(watch, "MAX_UNREACHABLE_SECONDS", 10.0)
    dag_id, run_id = f"npa_burst_outage_{uuid.uuid4().hex[:6]}", "manual__outage"
    cluster = try_name(dag_id, run_id, 1)
    try:
        ctx1 = task_context(dag_id, 1, run_id)
        op1 = burst_operator(ticks=60)
        trigger = submit_deferred(op1, ctx1)
        run = asyncio.ensure_future(run_trigger(trigger, 900))
        while (job_id := trigger._current.job_id) is None or (
            await asyncio.to_thread(job_state, skypilot_server, cluster, job_id) != "RUNNING"
        ):
            assert not run.done(), run.result()
            await asyncio.sleep(2)
        proxy.cut()
        event = await run
        proxy.restore()
        assert event["status"] == "interrupted", event
        with pytest.raises(AirflowException) as failure:
            op1.execute_complete(ctx1, event)
        assert not isinstance(failure.value, AirflowFailException), "an outage must leave the task retryable"
        assert cluster in server_clusters(skypilot_server), "the outage tore the running cluster down"
        assert job_state(skypilot_server, cluster, job_id) == "RUNNING"

        ctx2 = task_context(dag_id, 2, run_id)
        op2 = burst_operator(ticks=60)
        trigger2 = submit_deferred(op2, ctx2)
        assert (trigger2.handle.cluster, trigger2.handle.job_id) == (cluster, job_id)
        # The triggerer reports a connection it cannot fetch as not defined: the trigger waits that out too.
        monkeypatch.delenv("AIRFLOW_CONN_SKYPILOT_DEFAULT")
        run2 = asyncio.ensure_future(run_trigger(trigger2, 900))
        await asyncio.sleep(5)
        assert not run2.done(), run2.result()
        monkeypatch.setenv("AIRFLOW_CONN_SKYPILOT_DEFAULT", conn)
        event2 = await run2
        assert event2["status"] == "success", event2
        op2.execute_complete(ctx2, event2)
    finally:
        proxy.close()
    assert cluster not in server_clusters(skypilot_server)
    assert launches_for(skypilot_server, try_name(dag_id, run_id, 2)) == []
    assert wait_no_slurm_jobs(cluster) == []


def test_failed_job_is_a_program_failure_and_a_failed_launch_is_retried(skypilot_server, skypilot_slurm):
    """A job that exits 3 fails the task without a retry, with the end of its log; a launch SkyPilot cannot
    provision (a cloud that is not enabled) is infrastructure: the task stays retryable."""
    dag_id, run_id = f"npa_burst_fail_{uuid.uuid4().hex[:6]}", "manual__fail"
    op = burst_operator(ticks=2, exit_code=3, deferrable=False)
    with pytest.raises(AirflowFailException) as failure:
        op.execute(task_context(dag_id, 1, run_id))
    assert "a program failure, not retried" in str(failure.value)
    assert "npa-lifecycle-end exit 3" in str(failure.value)
    cluster = try_name(dag_id, run_id, 1)
    assert cluster not in server_clusters(skypilot_server)

    unprovisionable = burst_operator(deferrable=False, infra="aws", cluster_name="npa-lifecycle-no-cloud")
    with pytest.raises(AirflowException) as launch_failure:
        unprovisionable.execute(task_context(f"{dag_id}_aws", 1, run_id))
    assert not isinstance(launch_failure.value, AirflowFailException)
    assert "infrastructure reason" in str(launch_failure.value)


def test_two_deployments_with_the_same_dag_and_run_launch_two_clusters_and_each_keeps_its_own(
    skypilot_server, skypilot_slurm, monkeypatch
):
    """Staging and prod on one SkyPilot API server and user, the same DAG for the same date: the deployment keys
    the cluster names, so each launches its own cluster, and prod's retry reattaches to prod's launch, never
    staging's. Then each takes down only its own."""
    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.common import deployment as d

    dag_id, run_id = f"npa_burst_two_{uuid.uuid4().hex[:6]}", "scheduled__2026-12-04T00:00:00+00:00"
    staging = d.Deployment("staging-deployment-key-000001", None, "test")
    prod = d.Deployment("prod-deployment-key-00000000001", None, "test")
    handles = {}
    try:
        for label, identity in (("staging", staging), ("prod", prod)):
            monkeypatch.setattr(d, "current_deployment", lambda identity=identity: identity)
            trigger = submit_deferred(burst_operator(ticks=120), task_context(dag_id, 1, run_id))
            handles[label] = trigger.handle.to_dict()
        assert handles["staging"]["cluster"] != handles["prod"]["cluster"]
        monkeypatch.setattr(d, "current_deployment", lambda: prod)
        retry = submit_deferred(burst_operator(ticks=120), task_context(dag_id, 2, run_id)).handle.to_dict()
        assert (retry["cluster"], retry["request_id"]) == (handles["prod"]["cluster"], handles["prod"]["request_id"])
        assert len(launches_for(skypilot_server, handles["staging"]["cluster"])) == 1
        assert launches_for(skypilot_server, try_name(dag_id, run_id, 2)) == []  # no launch under any try-2 name
    finally:
        for handle in handles.values():
            with SkyPilotHook(handle["conn_id"]) as hook:
                hook.cancel_and_teardown(BurstJobHandle.from_dict(handle), logging.getLogger(__name__))
    names = set(server_clusters(skypilot_server))
    assert not names & {h["cluster"] for h in handles.values()}
