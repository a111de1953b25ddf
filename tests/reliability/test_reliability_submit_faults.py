"""Faults around submission, on the real cluster: the connection dropped right after sbatch ran, the task
process killed after submit, a login host down, a deferral that times out. Each test counts its
injections and the jobs Slurm actually has: nothing lost, nothing duplicated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from reliability_harness import (
    REPO,
    collecting_logger,
    context,
    jobs_settled,
    make_operator,
    record_figures,
    run_trigger,
    submit_deferred,
    unique_dag,
)

from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import job_name as job_name_for

pytestmark = pytest.mark.integration

DROPS = 20


@pytest.fixture
def sbatch_drop(slurm_cluster):
    """Arm the cluster's sbatch shim (tests/standins/sbatch) for given job names; yields (arm, drop log)."""
    faults = Path(slurm_cluster.dir) / "faults"
    armed = faults / "sbatch-drop"
    log = faults / "sbatch-drop.log"
    armed.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{slurm_cluster.user}:{slurm_cluster.user}", str(faults)], check=True)
    start = log.stat().st_size if log.exists() else 0

    def arm(job_name: str) -> None:
        (armed / job_name).touch()
        os.chown(armed / job_name, *_uid_gid(slurm_cluster.user))

    def drops() -> list[tuple[str, str, str]]:
        if not log.exists():
            return []
        with log.open() as handle:
            handle.seek(start)
            return [tuple(line.split(" ", 2)) for line in handle.read().splitlines() if line.strip()]

    yield arm, drops
    for leftover in armed.iterdir():
        leftover.unlink()


def _uid_gid(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def test_connection_dropped_after_sbatch_20_times_yields_exactly_20_adopted_jobs(
    slurm_cluster, cluster_ssh, sbatch_drop, capfd
):
    arm, drops = sbatch_drop
    dag_id = unique_dag("drop")
    handles = []
    started = time.monotonic()
    for index in range(DROPS):
        ctx = context(dag_id, run_id=f"manual__drop-{index:02d}")
        name = job_name_for(dag_id, "train", ctx["ti"].run_id, -1, 1)
        arm(name)
        op = make_operator(command="sleep 1", time_hours=0.05)
        capfd.readouterr()
        trigger = submit_deferred(op, ctx)
        log = "".join(capfd.readouterr())
        assert "is ambiguous" in log, log[-3000:]
        assert f"Adopting Slurm job {trigger.handle.job_id}" in log, log[-3000:]
        handles.append(trigger.handle.to_dict())
    elapsed = time.monotonic() - started

    injected = drops()
    assert len(injected) == DROPS, injected
    assert all(rc == "0" for _, rc, _ in injected)  # sbatch itself succeeded every time
    created = {name: last for name, _, last in injected}  # the id sbatch printed but nobody received
    jobs = jobs_settled(cluster_ssh, f"npa-{dag_id.replace('_', '-')}", DROPS)
    assert len(jobs) == DROPS, jobs  # exactly one job per submission: none lost, none duplicated
    assert {h["job_name"]: h["job_id"] for h in handles} == created  # each adopted by its exact name
    assert {j["name"]: j["id"] for j in jobs} == created
    record_figures(
        "ssh_drop_after_sbatch",
        injections=len(injected),
        jobs_created=len(jobs),
        adopted=len(handles),
        lost=DROPS - len(handles),
        duplicated=len(jobs) - DROPS,
        seconds_per_submission=round(elapsed / DROPS, 2),
    )


def test_a_batch_cut_after_one_of_its_sbatch_runs_answers_what_it_had_and_leaves_the_rest_ambiguous(
    slurm_cluster, cluster_ssh, sbatch_drop
):
    """Submissions that meet go in one session: when it drops right after the second one's sbatch ran, the first
    has its job id, and the second and third are ambiguous (to be reconciled by name): none is said refused, so
    none is submitted twice; the second's job exists."""
    import asyncio

    from npa_airflow.exceptions import NpaAmbiguousSubmission
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.submit.staging import StagedFile

    arm, drops = sbatch_drop
    base = f"npa-batch-cut-{uuid.uuid4().hex[:8]}"
    workdir = f"{slurm_cluster.shared}/tests/{base}"
    arm(f"{base}-1")
    hook = SlurmHook("slurm_default")

    def submit(i: int):
        script = f"{workdir}/{i}.sbatch"
        body = f"#!/bin/bash\n#SBATCH --job-name={base}-{i}\ntrue\n".encode()
        args = ["--partition=cpu", f"--output={workdir}/%j.out", "--time=2", "--hold"]
        return hook.astage_and_submit([StagedFile(script, body, 0o700)], script, sbatch_args=args)

    async def batch():
        await hook.aconfig()
        answers = await asyncio.gather(*(submit(i) for i in range(3)), return_exceptions=True)
        return answers, await hook.afind_jobs_by_name([f"{base}-{i}" for i in range(3)])

    answers, found = asyncio.run(batch())
    jobs = {info.job_name: info.job_id for info in found}
    try:
        assert [name for name, *_ in drops()] == [f"{base}-1"]
        assert not isinstance(answers[0], BaseException) and answers[0].job_id == jobs[f"{base}-0"]
        assert all(isinstance(answer, NpaAmbiguousSubmission) for answer in answers[1:]), answers
        assert f"{base}-1" in jobs and len(found) == len(jobs)  # one job per name: nothing submitted twice
    finally:
        cluster_ssh(f"scancel {' '.join(jobs.values())}")


@pytest.mark.slow
def test_task_process_killed_after_submit_next_try_reattaches(slurm_cluster, cluster_ssh, tmp_path):
    """SIGKILL of the worker process right after its job appears: try 2 adopts that job, submits none."""
    kills = 3
    results = []
    for index in range(kills):
        dag_id = unique_dag("sigkill")
        run_id = f"manual__kill-{index}"
        worker = tmp_path / f"worker{index}.py"
        worker.write_text(
            textwrap.dedent(
                f"""
                import sys
                sys.path[:0] = [{str(REPO)!r}, {str(Path(__file__).parent)!r}]
                from reliability_harness import context, make_operator
                op = make_operator(command="sleep 20; echo finished", deferrable=False)
                ctx = context({dag_id!r}, try_number=1, run_id={run_id!r})
                op.render_template_fields(ctx)
                op.execute(ctx)
                """
            )
        )
        env = {**os.environ, "AIRFLOW_CONN_SLURM_DEFAULT": slurm_cluster.conn_uri_json}
        proc = subprocess.Popen([sys.executable, str(worker)], env=env, start_new_session=True)
        first_name = job_name_for(dag_id, "train", run_id, -1, 1)
        try:
            deadline = time.monotonic() + 60
            while not cluster_ssh(f"squeue -h -o %i --name={first_name}", check=True).stdout.strip():
                assert proc.poll() is None and time.monotonic() < deadline, "the worker never submitted"
                time.sleep(0.3)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # no on_kill, no cleanup: the job keeps running
            proc.wait()
        op = make_operator(command="sleep 20; echo finished")
        trigger = submit_deferred(op, context(dag_id, try_number=2, run_id=run_id))
        jobs = jobs_settled(cluster_ssh, f"npa-{dag_id.replace('_', '-')}", 1, timeout=20)
        results.append((trigger.handle.to_dict(), jobs))
        cluster_ssh(f"scancel {trigger.handle.job_id}")
    for handle, jobs in results:
        assert [j["id"] for j in jobs] == [handle["job_id"]]  # one job: try 2 reattached to try 1's
        assert jobs[0]["name"].endswith("-t1") and handle["job_name"].endswith("-t1")
    record_figures("sigkill_after_submit", injections=kills, second_jobs=0, reattached=len(results), lost=0)


def test_login_host_down_fails_over_to_the_second_with_a_clear_log_line(slurm_cluster, cluster_ssh, monkeypatch, capfd):
    import json

    conn = json.loads(slurm_cluster.conn_uri_json)
    conn["host"] = f"127.0.0.1:1,127.0.0.1:{slurm_cluster.port2}"  # the first login host is down
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_FAILOVER", json.dumps(conn))
    dag_id = unique_dag("failover")
    trigger = submit_deferred(make_operator(slurm_conn_id="slurm_failover", command="echo via-second"), context(dag_id))
    out, err = capfd.readouterr()
    assert "Login host 127.0.0.1:1 unreachable" in out + err
    assert f"failing over to 127.0.0.1:{slurm_cluster.port2}" in out + err
    (job,) = jobs_settled(cluster_ssh, f"npa-{dag_id.replace('_', '-')}", 1)
    assert job["id"] == trigger.handle.job_id
    record_figures("login_host_down", injections=1, failed_over=1, lost=0)


def test_deferral_deadline_cancels_the_job_instead_of_orphaning_it(slurm_cluster, cluster_ssh):
    """The wait's deadline passes while the job still runs: the trigger fires, the operator scancels."""
    from airflow.sdk.exceptions import AirflowException

    dag_id = unique_dag("deadline")
    op = make_operator(command="sleep 300", max_wait=timedelta(seconds=8))
    ctx = context(dag_id)
    trigger = submit_deferred(op, ctx)
    reset_pollers()
    logger, _ = collecting_logger("deadline")
    import asyncio

    event = asyncio.run(run_trigger(trigger, logger, timeout=60))
    assert event.payload["status"] == "deadline"
    with pytest.raises(AirflowException, match="deadline"):
        op.execute_complete(ctx, event.payload)
    (job,) = jobs_settled(cluster_ssh, trigger.handle.job_name, 1)
    deadline = time.monotonic() + 30
    while job["state"] not in ("CANCELLED",) and time.monotonic() < deadline:
        time.sleep(1)
        (job,) = jobs_settled(cluster_ssh, trigger.handle.job_name, 1, timeout=5)
    assert job["state"] == "CANCELLED"


@pytest.mark.parametrize("policy", ["reattach", "cancel"])
def test_retry_after_a_deferral_timeout_leaves_no_orphan(slurm_cluster, cluster_ssh, policy):
    """Airflow's own deferral timeout drops the trigger without any event (no cancel). The retry either
    adopts the still-running job (reattach) or cancels it and submits its own (cancel): never two live jobs."""
    dag_id = unique_dag(f"timeout_{policy}")
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    first = submit_deferred(make_operator(command="sleep 120"), context(dag_id, 1, run_id))
    # the deferral times out: the trigger is simply dropped; try 2 starts
    second = submit_deferred(make_operator(command="sleep 120", on_previous_try=policy), context(dag_id, 2, run_id))
    jobs = jobs_settled(cluster_ssh, f"npa-{dag_id.replace('_', '-')}", 1 if policy == "reattach" else 2)
    live = [j for j in jobs if j["state"] in ("PENDING", "RUNNING")]
    try:
        if policy == "reattach":
            assert second.handle.job_id == first.handle.job_id and len(jobs) == 1
        else:
            assert second.handle.job_id != first.handle.job_id
            states = {j["id"]: j["state"] for j in jobs}
            deadline = time.monotonic() + 20
            while states.get(first.handle.job_id) != "CANCELLED" and time.monotonic() < deadline:
                time.sleep(1)
                states = {j["id"]: j["state"] for j in jobs_settled(cluster_ssh, f"npa-{dag_id.replace('_', '-')}", 2)}
            assert states[first.handle.job_id] == "CANCELLED"
            live = [i for i, s in states.items() if s in ("PENDING", "RUNNING")]
            assert live == [second.handle.job_id]
    finally:
        for job in jobs:
            cluster_ssh(f"scancel {job['id']}")
    record_figures(f"deferral_timeout_retry_{policy}", injections=1, orphaned=0, live_jobs_after_retry=1)
