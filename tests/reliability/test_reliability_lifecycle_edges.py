"""Lifecycle edge cases on the real cluster: a worker killed while sbatch or the reconciliation of an ambiguous
submission is in flight, a cancel that cannot happen, max_wait across a reattach, a job the cluster does not
know, and an earlier try's job cancelled by an administrator. Each test reads what Slurm itself has: no job
left running behind a killed task, none resubmitted behind the user's back, no cancel reported that did not
happen.

The slow and the dropped sbatch come from the TEST FAULT SHIM tests/standins/sbatch (armed per test; it runs the
real sbatch). The worker kill is Airflow's own: `dag.test()` runs the task through Airflow's task runner, whose
SIGTERM handler calls on_kill, and the test then does what Airflow's supervisor does, SIGKILL 5 s later.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from reliability_harness import (
    RUNNER,
    airflow_home,
    collecting_logger,
    context,
    jobs_settled,
    make_operator,
    record_figures,
    run_trigger,
    submit_deferred,
    unique_dag,
)
from test_reliability_wait_faults import private_sshd  # noqa: F401 (fixture)

from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import job_name as job_name_for
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = pytest.mark.integration
SUPERVISOR_KILL_DELAY = 5.0  # Airflow's supervisor: SIGTERM (the task runs on_kill), SIGKILL 5 s later
LIVE_STATES = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "SUSPENDED")


# -- helpers ------------------------------------------------------------------------------------------------


def job_prefix(dag_id: str, task_id: str = "train") -> str:
    """The start of every job name of the task: "npa-<slug>-" (the rest is the task instance hash and try)."""
    return job_name_for(dag_id, task_id, "any", -1, 1).rsplit("-", 2)[0] + "-"


def settled_states(cluster_ssh, prefix: str, expected: int, timeout: float = 90) -> list[dict[str, str]]:
    """The jobs named `prefix...` once at least `expected` exist and none is live any more (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = jobs_settled(cluster_ssh, prefix, expected, timeout=5)
        live = [j for j in jobs if j["state"] in LIVE_STATES]
        if (len(jobs) >= expected and not live) or time.monotonic() > deadline:
            return jobs
        time.sleep(2)


def scancel_all(cluster_ssh, prefix: str) -> None:
    for job in jobs_settled(cluster_ssh, prefix, 0, timeout=0):
        if job["state"] in LIVE_STATES:
            cluster_ssh(f"scancel {job['id']}")


def unknown_job_id(slurm_cluster, cluster_ssh) -> str:
    """A job id that neither sacct (where the bed keeps accounting) nor squeue knows (far above every id this
    cluster has handed out)."""
    for candidate in ("67000001", "66000001", "65000001"):
        sacct = ""
        if slurm_cluster.accounting:
            sacct = cluster_ssh(f"sacct -X -n -P -j {candidate} -o JobID", check=True).stdout.strip()
        squeue = cluster_ssh(f"squeue -h -t all -j {candidate} -o %i 2>/dev/null").stdout.strip()
        if not sacct and not squeue:
            return candidate
    raise AssertionError("no unused job id found")


def handle_of_unknown_job(slurm_cluster, job_id: str) -> dict:
    name = f"npa-lost-{uuid.uuid4().hex[:10]}-t1"
    root = f"{slurm_cluster.results_root}/{name}"
    return {
        "conn_id": "slurm_default", "cluster": None, "job_id": job_id, "job_name": name,
        "login_host": f"{slurm_cluster.host}:{slurm_cluster.port}", "results_dir": root,
        "stdout_path": f"{root}/main.out", "stderr_path": f"{root}/main.err", "try_number": 1,
        "retry_of": None, "submitted_at": time.time(),
    }  # fmt: skip


def slurm_submit_time(cluster_ssh, job_id: str) -> float:
    out = cluster_ssh(f"SLURM_TIME_FORMAT=%s squeue -h -t all -j {job_id} -o %V", check=True).stdout.strip()
    return float(out)


def wait_for_state(slurm_cluster, cluster_ssh, job_id: str, prefix: str, timeout: float = 60) -> str:
    """The job's state once it starts with `prefix` (or at the timeout): sacct's (CANCELLED by <uid>), or
    slurmctld's on the bed without accounting (CANCELLED, no uid)."""
    deadline = time.monotonic() + timeout
    query = (
        f"sacct -X -n -P -j {job_id} -o State" if slurm_cluster.accounting else f"squeue -h -t all -j {job_id} -o %T"
    )
    while True:
        out = cluster_ssh(query, check=True).stdout.strip()
        if out.startswith(prefix) or time.monotonic() > deadline:
            return out
        time.sleep(1)


def admin_named(slurm_cluster) -> str:
    """How a task's failure names an admin's cancel: by uid from accounting, or saying that it cannot."""
    if slurm_cluster.accounting:
        return "cancelled outside Airflow by uid 0 (root)"
    return "this cluster keeps no accounting, so who cancelled it is not recorded"


# -- the sbatch fault shim, slow mode --------------------------------------------------------------------------


@pytest.fixture
def sbatch_slow(slurm_cluster):
    """Arm the shim's slow mode for a job-name prefix: (arm(prefix, seconds, mode), fired(prefix))."""
    faults = Path(slurm_cluster.dir) / "faults"
    armed, log = faults / "sbatch-slow", faults / "sbatch-slow.log"
    armed.mkdir(parents=True, exist_ok=True)
    user = pwd.getpwnam(slurm_cluster.user)
    subprocess.run(["chown", "-R", f"{slurm_cluster.user}:{slurm_cluster.user}", str(faults)], check=True)
    start = log.stat().st_size if log.exists() else 0

    def arm(prefix: str, seconds: int, mode: str = "") -> None:
        (armed / prefix).write_text(f"{seconds} {mode}\n")
        os.chown(armed / prefix, user.pw_uid, user.pw_gid)

    def fired(prefix: str) -> bool:
        if not log.exists():
            return False
        with log.open() as handle:
            handle.seek(start)
            return any(line.startswith(prefix) for line in handle.read().splitlines())

    yield arm, fired
    for leftover in armed.iterdir():
        leftover.unlink()


# -- a worker that Airflow kills ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, slurm_cluster) -> dict[str, str]:
    return airflow_home(tmp_path_factory.mktemp("airflow-kill"), slurm_default=json.loads(slurm_cluster.conn_uri_json))


class KilledWorker:
    """`dag.test()` of a one-task DAG in its own process group: the task runs under Airflow's task runner."""

    def __init__(self, env: dict[str, str], dag_id: str, command: str, extra: str = "") -> None:
        home = Path(env["AIRFLOW_HOME"])
        (home / "dags").mkdir(exist_ok=True)
        dag_file = home / "dags" / f"{dag_id}.py"
        dag_file.write_text(
            textwrap.dedent(
                f"""
                from datetime import datetime
                from airflow.sdk import DAG
                from npa_airflow.slurm.operators import SlurmSubmitOperator

                with DAG(dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
                    SlurmSubmitOperator(
                        task_id="train", command={command!r}, partition="cpu", gpus_per_node=0, cpus_per_task=1,
                        time_hours=0.1, poll_interval=2, {extra}
                    )
                """
            )
        )
        runner = home / "run_dag_test.py"
        runner.write_text(RUNNER)
        self.proc = subprocess.Popen(
            [sys.executable, str(runner), str(dag_file)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_until(self, ready, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the worker ended before {what}:\n{self.output[-6000:]}"
            assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{self.output[-6000:]}"
            time.sleep(0.2)

    def kill_as_airflow_does(self) -> bool:
        """SIGTERM (Airflow's task runner calls on_kill), then SIGKILL if still alive 5 s later. True if killed."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(SUPERVISOR_KILL_DELAY)
            return False
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return True


# -- (a) the worker is killed while its job is being submitted ----------------------------------------------


@pytest.mark.parametrize("sbatch_seconds", [3, 9], ids=["sbatch-answers-before-sigkill", "sbatch-outlives-worker"])
def test_worker_killed_while_sbatch_runs_leaves_no_job_running(
    sbatch_seconds, airflow_env, sbatch_slow, cluster_ssh, slurm_cluster
):
    """...and no secrets sidecar: the job never runs, so the one staged for it is shredded."""
    arm, fired = sbatch_slow
    dag_id = unique_dag("killsb")
    prefix = job_prefix(dag_id)
    arm(prefix, sbatch_seconds)
    env = {**airflow_env, "AIRFLOW_VAR_NPA_KILL_TOKEN": f"kill-{uuid.uuid4().hex}"}
    worker = KilledWorker(env, dag_id, "sleep 120", extra='secret_env={"NPA_TOKEN": "var:npa_kill_token"},')
    try:
        worker.wait_until(lambda: fired(prefix), "sbatch in flight")
        sigkilled = worker.kill_as_airflow_does()
        jobs = settled_states(cluster_ssh, prefix, 1)
    finally:
        scancel_all(cluster_ssh, prefix)
    assert [j["state"] for j in jobs] == ["CANCELLED"], (jobs, worker.output[-4000:])
    assert "was being submitted" in worker.output, worker.output[-4000:]
    sidecars = cluster_ssh(f"ls {slurm_cluster.results_root}/sidecars", check=True).stdout.split()  # staged there
    assert not [name for name in sidecars if name.startswith(prefix)], sidecars
    record_figures(
        f"kill_during_sbatch_{sbatch_seconds}s",
        injections=1, sigkilled=sigkilled, jobs_created=len(jobs), left_running=0, lost=0,
    )  # fmt: skip


def test_worker_killed_while_reconciling_an_ambiguous_submission_leaves_no_job_running(
    airflow_env, sbatch_slow, cluster_ssh
):
    """The session drops before sbatch runs (the client reconciles by name), sbatch creates the job 9 s later."""
    arm, fired = sbatch_slow
    dag_id = unique_dag("killrc")
    prefix = job_prefix(dag_id)
    arm(prefix, 9, "drop-first")
    worker = KilledWorker(airflow_env, dag_id, "sleep 120")
    try:
        worker.wait_until(lambda: "reconciling by job name" in worker.output, "reconciliation")
        assert fired(prefix)
        sigkilled = worker.kill_as_airflow_does()
        jobs = settled_states(cluster_ssh, prefix, 1)
    finally:
        scancel_all(cluster_ssh, prefix)
    assert [j["state"] for j in jobs] == ["CANCELLED"], (jobs, worker.output[-4000:])
    record_figures("kill_during_reconcile", injections=1, sigkilled=sigkilled, jobs_created=len(jobs), left_running=0)


# -- (b) a cancel that does not happen is a failure ------------------------------------------------------


def test_a_cancel_the_cluster_cannot_do_is_reported_as_a_failure_never_as_cancelled(slurm_cluster, cluster_ssh, capfd):
    """scancel of Slurm 22.05 exits 0 for a job id slurmctld does not know: that is no cancel."""
    from airflow.sdk.exceptions import AirflowException

    from npa_airflow.slurm.triggers import make_event_payload

    handle = handle_of_unknown_job(slurm_cluster, unknown_job_id(slurm_cluster, cluster_ssh))
    op = make_operator(command="true")
    capfd.readouterr()
    with pytest.raises(AirflowException) as err:
        op.execute_complete(context(unique_dag("cancelfail")), make_event_payload("deadline", handle, "late"))
    log = "".join(capfd.readouterr())
    assert "could NOT be cancelled" in str(err.value) and "does not know" in str(err.value), str(err.value)
    assert f"Cancelled Slurm job {handle['job_id']}" not in log
    assert f"Could not cancel Slurm job {handle['job_id']}" in log
    record_figures("cancel_of_unknown_job", injections=1, reported_as_cancelled=0, reported_as_failure=1)


def test_on_kill_with_the_login_host_down_retries_then_reports_the_failure(private_sshd, cluster_ssh, capfd):  # noqa: F811
    op = make_operator(slurm_conn_id="slurm_private_sshd", command="sleep 120")
    trigger = submit_deferred(op, context(unique_dag("killdown")))
    job_id = trigger.handle.job_id
    private_sshd.stop()
    try:
        capfd.readouterr()
        op.on_kill()
        log = "".join(capfd.readouterr())
    finally:
        private_sshd.start()
        cluster_ssh(f"scancel {job_id}")
    attempts = 1 + log.count("retrying in")
    assert attempts >= 2, log[-3000:]
    assert f"Could not cancel Slurm job {job_id}" in log and f"Cancelled Slurm job {job_id}" not in log
    record_figures("on_kill_with_ssh_down", injections=1, attempts=attempts, reported_as_cancelled=0)


# -- (c) max_wait counts from the first submission ---------------------------------------------------------


def test_a_reattaching_retry_keeps_the_first_submissions_max_wait(slurm_cluster, cluster_ssh):
    from airflow.sdk.exceptions import AirflowException

    dag_id, run_id = unique_dag("maxwait"), f"manual__{uuid.uuid4().hex[:8]}"
    max_wait = timedelta(seconds=40)
    first = submit_deferred(make_operator(command="sleep 300", max_wait=max_wait), context(dag_id, 1, run_id))
    submitted = slurm_submit_time(cluster_ssh, first.handle.job_id)
    time.sleep(6)  # the retry starts later: a budget counted from the retry would end later too
    retry = make_operator(command="sleep 300", max_wait=max_wait)
    ctx = context(dag_id, 2, run_id)
    second = submit_deferred(retry, ctx)
    try:
        assert second.handle.job_id == first.handle.job_id  # reattached
        assert second.handle.submitted_at == submitted  # Slurm's own submit time
        assert second.deadline == submitted + max_wait.total_seconds()
        reset_pollers()
        logger, collected = collecting_logger("maxwait")
        event = asyncio.run(run_trigger(second, logger, timeout=120))
        assert event.payload["status"] == "deadline", (event.payload, collected.lines)
        with pytest.raises(AirflowException, match="deadline"):
            retry.execute_complete(ctx, event.payload)
        assert wait_for_state(slurm_cluster, cluster_ssh, first.handle.job_id, "CANCELLED").startswith("CANCELLED")
    finally:
        cluster_ssh(f"scancel {first.handle.job_id}")
    record_figures("max_wait_across_reattach", injections=1, retry_started_after_s=6, fresh_budget=0)


# -- (d) a job the cluster does not know -------------------------------------------------------------------


def test_a_job_neither_sacct_nor_squeue_knows_ends_the_wait_with_a_clear_failure(slurm_cluster, cluster_ssh):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from npa_airflow.slurm.triggers import SlurmJobTrigger

    handle = handle_of_unknown_job(slurm_cluster, unknown_job_id(slurm_cluster, cluster_ssh))
    trigger = SlurmJobTrigger(handle, "slurm_default", poll_interval=2, deadline=time.time() + 150, vanished_after=15)
    reset_pollers()
    logger, _ = collecting_logger("vanished")
    started = time.monotonic()
    event = asyncio.run(run_trigger(trigger, logger, timeout=200))
    waited = time.monotonic() - started
    if slurm_cluster.accounting:
        assert event.payload["status"] == "vanished", event.payload
        assert "neither sacct nor squeue" in event.payload["message"]
    else:  # slurmctld forgets an ended job: one it does not know, with no end record, ended without saying how
        assert event.payload["status"] == "failed", event.payload
        assert "left no end record" in event.payload["message"], event.payload["message"]
    op = make_operator(command="true")
    with pytest.raises(AirflowException) as err:
        op.execute_complete(context(unique_dag("vanished")), event.payload)
    # With accounting: retryable, a retry looks for the job by name. Without: a cancel and a crash look the same
    # once slurmctld forgot the job, so it is not run again (the message says why).
    assert isinstance(err.value, AirflowFailException) is not slurm_cluster.accounting, err.value
    assert slurm_cluster.accounting or "keeps no accounting" in str(err.value)
    record_figures("job_absent_from_sacct_and_squeue", injections=1, vanished_after_s=15, waited_s=round(waited))


# -- (e) an earlier try's job cancelled outside Airflow ----------------------------------------------------


def test_a_retry_never_resubmits_an_earlier_try_job_an_admin_cancelled(slurm_cluster, cluster_ssh, cluster_admin):
    from airflow.sdk.exceptions import AirflowFailException

    dag_id, run_id = unique_dag("admcancel"), f"manual__{uuid.uuid4().hex[:8]}"
    prefix = job_prefix(dag_id)
    first = submit_deferred(make_operator(command="sleep 120"), context(dag_id, 1, run_id))
    job_id = first.handle.job_id  # nobody watches it now (the first try's trigger was dropped)
    try:
        cluster_admin(f"scancel {job_id}")
        cancelled = "CANCELLED by 0" if slurm_cluster.accounting else "CANCELLED"
        assert wait_for_state(slurm_cluster, cluster_ssh, job_id, cancelled) == cancelled
        op = make_operator(command="sleep 120")
        ctx = context(dag_id, 2, run_id)
        op.render_template_fields(ctx)
        with pytest.raises(AirflowFailException) as err:
            op.execute(ctx)
        assert admin_named(slurm_cluster) in str(err.value), str(err.value)
        assert [j["id"] for j in jobs_settled(cluster_ssh, prefix, 1)] == [job_id]  # nothing resubmitted
        third = submit_deferred(make_operator(command="sleep 120"), context(dag_id, 3, run_id))  # a clear runs it
        assert third.handle.job_name.endswith("-t3")
    finally:
        scancel_all(cluster_ssh, prefix)
    record_figures("earlier_try_job_cancelled_by_admin", injections=1, resubmitted=0, named_uid=0)


def test_a_reattached_job_an_admin_cancels_fails_the_task_naming_who(slurm_cluster, cluster_ssh, cluster_admin):
    from airflow.sdk.exceptions import AirflowFailException

    dag_id, run_id = unique_dag("admwatch"), f"manual__{uuid.uuid4().hex[:8]}"
    prefix = job_prefix(dag_id)
    first = submit_deferred(make_operator(command="sleep 120"), context(dag_id, 1, run_id))
    op = make_operator(command="sleep 120")
    ctx = context(dag_id, 2, run_id)
    second = submit_deferred(op, ctx)
    try:
        assert second.handle.job_id == first.handle.job_id
        cluster_admin(f"scancel {first.handle.job_id}")
        reset_pollers()
        logger, _ = collecting_logger("admwatch")
        event = asyncio.run(run_trigger(second, logger, timeout=120))
        assert event.payload["status"] == "canceled"
        with pytest.raises(AirflowFailException) as err:
            op.execute_complete(ctx, event.payload)
        assert admin_named(slurm_cluster) in str(err.value), str(err.value)
        assert len(jobs_settled(cluster_ssh, prefix, 1)) == 1  # nothing resubmitted
    finally:
        scancel_all(cluster_ssh, prefix)
    record_figures("reattached_job_cancelled_by_admin", injections=1, resubmitted=0, named_uid=0)


def test_a_reattached_job_airflow_cancelled_for_a_clear_is_run_again(slurm_cluster, cluster_ssh, monkeypatch):
    """The other side of the rule: the earlier try's trigger cancels on a clear (Airflow's cancel): run again."""
    from airflow.sdk.exceptions import TaskDeferred

    dag_id, run_id = unique_dag("clear"), f"manual__{uuid.uuid4().hex[:8]}"
    prefix = job_prefix(dag_id)
    install_supervisor(monkeypatch, None)  # the user cleared the task: the first try's state is gone
    first = run_for_task_instance(submit_deferred(make_operator(command="sleep 120"), context(dag_id, 1, run_id)))
    op = make_operator(command="sleep 120")
    ctx = context(dag_id, 2, run_id)
    second = submit_deferred(op, ctx)
    try:

        async def clear_then_watch():
            run = asyncio.ensure_future(anext(first.run()))
            await asyncio.sleep(3)
            run.cancel()  # the triggerer drops the cleared try's trigger, then calls on_kill
            await first.on_kill()
            logger, _ = collecting_logger("clear")
            return await run_trigger(second, logger, timeout=120)

        reset_pollers()
        event = asyncio.run(clear_then_watch())
        assert event.payload["status"] == "canceled"
        with pytest.raises(TaskDeferred):  # the new job of this try, waited for
            op.execute_complete(ctx, event.payload)
        names = sorted(j["name"][-3:] for j in jobs_settled(cluster_ssh, prefix, 2))
        assert names == ["-t1", "-t2"]
    finally:
        scancel_all(cluster_ssh, prefix)
