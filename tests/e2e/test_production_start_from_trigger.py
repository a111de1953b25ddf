"""Tasks started in the triggerer (`start_from_trigger=True`) on the production shape: what differs from a task
started on a worker. The guarantees both modes share run in test_production_faults.py in each mode
(NPA_E2E_START=trigger: dev/test's 22.05 lane); this module runs in the 24.11 lane.

Which component ran what is read from the task log: a worker's run opens with its "Pre Execute" group, the
triggerer's lines come from the trigger ("trigger ... starting").
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.airflow_api import AirflowApiError, poll

pytestmark = pytest.mark.e2e

PLAIN, MAPPED, XCOMARG = "npa_e2e_start_plain", "npa_e2e_start_mapped", "npa_e2e_start_xcomarg"
WORKER_RUN = "Pre Execute"  # the group a worker's run of the task opens its log with
PLAIN_JOBS = "npa-npa-e2e-start-plain-ticker-"
LIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")


@pytest.fixture(scope="module")
def api(production):
    return production.api


def run_dag(api, dag_id: str, conf: dict | None = None) -> str:
    api.wait_for_dag(dag_id)
    return api.trigger(dag_id, conf=conf or {})


def task_instances(api, dag_id: str, run_id: str) -> list[dict]:
    r = api.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
    return r.json()["task_instances"]


def jobs_named(cluster_ssh, needle: str, since: float = 0) -> list[tuple[str, str, str]]:
    """(job id, name, state) of every job in accounting whose name holds `needle`, submitted at `since` or later
    (this machine's clock is the cluster's)."""
    query = "SLURM_TIME_FORMAT=%s sacct -X -n -P -a -S now-1hours -o JobID,JobName,State,Submit"
    rows = [line.split("|") for line in cluster_ssh(query, check=True).stdout.splitlines() if line.strip()]
    return [(r[0], r[1], r[2]) for r in rows if len(r) == 4 and needle in r[1] and float(r[3]) >= since]


def test_a_job_that_succeeds_ends_its_task_in_the_triggerer_with_no_worker(api, e2e_secret):
    run_id = run_dag(api, PLAIN, {"seconds": 5})
    deferred = api.wait_for_state(PLAIN, run_id, "ticker", {"deferred"}, timeout=60)
    trigger = deferred.get("trigger") or {}  # the scheduler deferred it straight to the start trigger
    done = api.wait_for_state(PLAIN, run_id, "ticker", {"success"}, timeout=120)
    log = api.log_lines(PLAIN, run_id, "ticker", 1)
    text_log = "\n".join(log)
    assert deferred["try_number"] == done["try_number"] == 1
    assert WORKER_RUN not in text_log, text_log  # no worker ran it: neither to start nor to end it
    assert "Submitted npa-npa-e2e-start-plain-ticker-" in text_log and "tick 5 of 5" in text_log, text_log
    assert "token: ***" in text_log and e2e_secret not in text_log
    assert trigger.get("classpath") == "npa_airflow.slurm.start_trigger.SlurmStartTrigger", trigger
    # Airflow 3.3.2's triggerer writes no rendered fields (its runner has no message for them): the UI's Rendered
    # Template stays empty, why this mode is not the default (README). If this fails, Airflow writes them now.
    assert not done.get("rendered_fields"), done.get("rendered_fields")
    handle = api.xcom(PLAIN, run_id, "ticker", "slurm_job")
    assert api.xcom(PLAIN, run_id, "ticker", "return_value") == handle  # what the worker's execute_complete returns
    usage = api.xcom(PLAIN, run_id, "ticker", "npa_usage")
    assert usage is not None and e2e_secret not in str(usage)


def test_a_program_failure_resumes_on_a_worker_and_is_not_retried(api):
    run_id = run_dag(api, PLAIN, {"seconds": 1, "exit_code": 3})
    done = api.wait_for_state(PLAIN, run_id, "ticker", {"failed", "up_for_retry", "success"}, timeout=180)
    text_log = "\n".join(api.log_lines(PLAIN, run_id, "ticker", 1))
    assert done["state"] == "failed" and done["try_number"] == 1, done  # retries=1 was not spent
    assert WORKER_RUN in text_log and "a program failure, not retried" in text_log, text_log


def test_mapped_tasks_start_in_the_triggerer_with_an_upstream_tasks_values(api):
    values = [11, 22, 33]
    run_id = run_dag(api, MAPPED, {"values": values})
    poll(
        lambda: (
            (tis := [t for t in task_instances(api, MAPPED, run_id) if t["task_id"] == "echo"])
            and len(tis) == len(values)
            and all(t["state"] == "success" for t in tis)
        ),
        240,
        "every mapped task's success",
        interval=2,
    )
    for index, value in enumerate(values):
        text_log = "\n".join(api.log_lines(MAPPED, run_id, "echo", 1, map_index=index))
        assert f"value {value}" in text_log and WORKER_RUN not in text_log, text_log


def test_a_task_the_triggerer_cannot_rebuild_and_a_later_try_start_on_a_worker(api):
    run_id = run_dag(api, XCOMARG)
    done = api.wait_for_state(XCOMARG, run_id, "greet", {"success", "failed"}, timeout=240)
    text_log = "\n".join(api.log_lines(XCOMARG, run_id, "greet", 1))
    assert done["state"] == "success", text_log
    # The worker's line: the start trigger's own ("Starting on a worker: ...") is erased when the job's wait lands
    # on the same triggerer (Airflow 3.3.2 opens a try's trigger log there with "wb" again).
    assert "Starting on this worker: the triggerer could not start it: NotRebuildable" in text_log, text_log
    assert "XComArg" in text_log, text_log
    # The job's last lines, streamed by the wait trigger just before its event, reach the task's log (not the
    # triggerer's: Airflow closes a trigger's log file when the trigger ends, whatever is still queued for it).
    assert "hello from upstream" in text_log and "is COMPLETED" in text_log and WORKER_RUN in text_log, text_log

    run_id = run_dag(api, PLAIN, {"seconds": 1})
    api.wait_for_state(PLAIN, run_id, "ticker", {"success"}, timeout=120)
    # A clear while the scheduler is marking the run successful can be lost to that write (the run ended success
    # with try 2 never scheduled, once in CI): clear once the run has ended.
    poll(lambda: api.dag_run(PLAIN, run_id)["state"] == "success", 60, "the run's success")
    api.request(
        "POST",
        f"/api/v2/dags/{PLAIN}/clearTaskInstances",
        json={"dry_run": False, "dag_run_id": run_id, "task_ids": ["ticker"], "only_failed": False},
    )
    done = poll(
        lambda: (
            (ti := api.task_instance(PLAIN, run_id, "ticker"))["try_number"] == 2 and ti["state"] == "success" and ti
        ),
        180,
        "try 2's success",
        interval=2,
    )
    text_log = "\n".join(api.log_lines(PLAIN, run_id, "ticker", done["try_number"]))
    assert "Starting on this worker: try 2 starts on a worker" in text_log, text_log


def test_a_users_action_during_the_start_leaves_no_job_running(api, cluster_ssh):
    """Marked failed as soon as the scheduler deferred it to the triggerer: whatever the start had submitted by
    then is cancelled (by the trigger's on_kill, or by the API server's listener); nothing runs on."""
    # The earlier tests' jobs were all submitted before this run; one that ended seconds ago may reach accounting
    # only now, so they are told apart by their submit time, not by what sacct listed before.
    since = int(time.time())
    run_id = run_dag(api, PLAIN, {"seconds": 120})
    api.wait_for_state(PLAIN, run_id, "ticker", {"deferred"}, timeout=120)
    api.set_state(PLAIN, run_id, "ticker", "failed")
    marked = time.monotonic()

    def settled() -> tuple[list] | None:  # a late sbatch would show within 30 s: none live by then
        jobs = jobs_named(cluster_ssh, PLAIN_JOBS, since)
        live = any(state in LIVE for _, _, state in jobs)
        return None if live or time.monotonic() - marked < 30 else (jobs,)  # no job at all is a result too

    (jobs,) = poll(settled, 90, "no job of the marked task still queued or running", interval=2)
    assert len(jobs) <= 1 and all(state.startswith("CANCELLED") for _, _, state in jobs), jobs


def test_a_user_marking_the_task_while_the_triggerer_submits_cancels_the_job_by_its_name(api, cluster_ssh):
    """Marked failed after sbatch returned in the triggerer and before the handle reached XCom (the test DAG
    lingers there): the trigger's on_kill reads the task instance's state and the operator cancels the job by the
    try's exact name; the listener has no handle to act on yet."""
    dag_id = "npa_e2e_slurm_worker_kill_trigger"
    api.wait_for_dag(dag_id)
    run_id = api.trigger(dag_id, conf={"seconds": 120, "linger": 60})

    def submitted() -> str | None:
        try:
            lines = api.log_lines(dag_id, run_id, "ticker", 1)
        except AirflowApiError:  # the task instance or its log does not exist yet
            return None
        return next((x.split()[1] for x in lines if x.startswith("Submitted ") and "as Slurm job" in x), None)

    job_name = poll(submitted, 120, "the submission in the triggerer", interval=1)
    assert api.xcom(dag_id, run_id, "ticker", "slurm_job") is None  # lingering: no handle yet
    api.set_state(dag_id, run_id, "ticker", "failed")
    marked = time.monotonic()

    def cancelled() -> list | None:
        jobs = jobs_named(cluster_ssh, job_name)
        return jobs if jobs and all(state.startswith("CANCELLED") for _, _, state in jobs) else None

    jobs = poll(cancelled, 60, f"{job_name} CANCELLED", interval=1)
    took = time.monotonic() - marked
    assert len(jobs) == 1, jobs
    print(f"\n[start] marked failed while the triggerer submitted: {job_name} CANCELLED in {took:.1f} s")
