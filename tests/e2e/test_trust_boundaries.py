"""Handles someone else wrote, on a real Airflow: XCom is writable through Airflow's REST API (and by any running
task through the execution API). The API server's listener and Compute page act only on what they derive for a task
instance (npa_airflow.trusted_jobs); a forged handle changes nothing on the cluster, and a malformed one breaks
neither the page nor another row."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.airflow_api import AirflowApi, poll
from tests.e2e.slurm_runs import DAG_ID, TASK_ID, start_job


def write_handle(api: AirflowApi, run_id: str, value: object) -> None:
    """Overwrite the task instance's `slurm_job` XCom, as a REST user with XCom write can."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/xcomEntries/slurm_job"
    api.request("PATCH", path, json={"value": value})


def api_server_log(airflow) -> str:
    return (Path(airflow.home) / "api-server.log").read_text(errors="replace")


@pytest.fixture
def victim(cluster_ssh, slurm_cluster):
    """A job of the same cluster account that is not this task's, and a canary file in the results root."""
    name = f"victim-{uuid.uuid4().hex[:6]}"
    out = cluster_ssh(
        f"sbatch --parsable -J {name} --hold -p cpu -t 5 -o /dev/null --chdir=/tmp --wrap true", check=True
    )
    job_id = out.stdout.strip().splitlines()[-1]
    canary = f"{slurm_cluster.results_root}/canary-{uuid.uuid4().hex[:6]}"
    cluster_ssh(f"echo alive > {canary} && mkdir -p {canary}.d/sbatch", check=True)
    yield job_id, canary
    cluster_ssh(f"scancel {job_id}; rm -rf {canary} {canary}.d")


def test_a_forged_handle_in_an_ended_task_s_xcom_changes_nothing_on_the_cluster(
    airflow, api, victim, cluster_ssh, sacct_state
):
    job_id, canary = victim
    # Not a job of a second or two: Airflow 3.3 fails a task whose trigger fires before the scheduler has read
    # the deferral's own exit (apache/airflow#72716), which a loaded scheduler reads seconds late.
    run_id, _ti, own = start_job(api, seconds=10)
    api.wait_for_state(DAG_ID, run_id, TASK_ID, {"success"}, timeout=120)
    handle = api.xcom(DAG_ID, run_id, TASK_ID, "slurm_job")
    forgeries = [
        {**handle, "job_id": job_id},  # this task's name, another job's id
        {**handle, "env_file": canary, "script_path": f"{canary}.d/sbatch/x.sbatch"},  # files outside the layout
        {**handle, "job_id": job_id, "conn_id": "slurm_elsewhere"},  # another connection
        {"job_id": job_id},  # malformed
    ]
    for forged in forgeries:
        write_handle(api, run_id, forged)
        api.set_state(DAG_ID, run_id, TASK_ID, "failed")  # the listener runs in the API server
        api.set_state(DAG_ID, run_id, TASK_ID, "success")  # and again
    verdicts = [
        f"Slurm job {job_id} was to be {handle['job_name']}, but the job with that id is victim-",
        f"Ignoring paths in the handle of {DAG_ID}.{TASK_ID} of run {run_id}",
        canary,
        "its connection 'slurm_elsewhere' is not the task's ('slurm_default')",
        "malformed Slurm job handle",
    ]

    def missing_verdicts() -> list[str]:
        log = api_server_log(airflow)
        return [verdict for verdict in verdicts if verdict not in log]

    # The request log names the run too, and a verdict that needs the cluster comes seconds after the others:
    # each verdict is waited for.
    deadline = time.monotonic() + 60
    while missing_verdicts() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not missing_verdicts(), missing_verdicts()
    assert sacct_state(job_id) == "PENDING"  # the other job keeps waiting
    assert cluster_ssh(f"cat {canary}; ls {canary}.d/sbatch", check=True).stdout.split() == ["alive"]
    assert own  # the task's own job had ended: nothing of it was left to cancel


def test_a_malformed_handle_in_one_task_breaks_neither_the_page_nor_another_row(api, wait_sacct):
    started = [start_job(api, seconds=90), start_job(api, seconds=90)]
    (bad_run, _, bad_job), (good_run, _, good_job) = started
    try:
        wait_sacct(good_job, ("RUNNING",), timeout=60)
        write_handle(api, bad_run, {"job_id": bad_job})  # no connection, no name: not a handle of this task

        def page_with_both() -> dict | None:
            data = api.get("/npa-compute/jobs")  # 200, or the request fails the test
            rows = {row["run_id"]: row for row in data["rows"]}
            good, bad = rows.get(good_run), rows.get(bad_run)
            return data if good and bad and good["state"] == "RUNNING" else None

        data = poll(page_with_both, 60, "the page listing both tasks")
        rows = {row["run_id"]: row for row in data["rows"]}
        assert rows[good_run]["job"] == good_job and rows[good_run]["error"] is None
        assert "malformed Slurm job handle" in rows[bad_run]["error"] and rows[bad_run]["job"] == "?"
        assert not data["errors"], data["errors"]  # the cluster's one state query did not fail for it
    finally:
        for run_id, _, job_id in started:
            api.set_state(DAG_ID, run_id, TASK_ID, "failed")  # the trigger's on_kill cancels with its own handle
            wait_sacct(job_id, ("CANCELLED", "COMPLETED"), timeout=60)
