"""Two Airflow deployments on one cluster account: prod (the e2e Airflow) and staging (a second AIRFLOW_HOME with its
own metadata database, its own DAG file of the same dag_id and task_id, run by `airflow dags test`) run the same
DAG for the same date, so both task instances have the same dag_id, task_id and run_id. Each gets its own job
(the deployment keys the name), each task's XCom and log show its own, and cancelling in prod leaves staging's job
running to its end."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_DEPLOYMENT_ENV
from tests.e2e.airflow_api import poll
from tests.e2e.slurm_runs import DAG_ID, TASK_ID

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
STAGING_DAGS = Path(__file__).resolve().parent / "dags_staging"
DATE = "2026-12-04"
RUN_ID = f"manual__{DATE}T00:00:00+00:00"  # what `airflow dags test <dag> <date>` names its run


@pytest.fixture
def staging(tmp_path, slurm_cluster):
    """A second deployment: its own AIRFLOW_HOME, metadata database (so its own identity) and DAG folder."""
    env = {k: v for k, v in os.environ.items() if k != TEST_DEPLOYMENT_ENV and not k.startswith("AIRFLOW__")}
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__CORE__LOAD_EXAMPLES="false",
        AIRFLOW__CORE__DAGS_FOLDER=str(STAGING_DAGS),
        AIRFLOW_CONN_SLURM_DEFAULT=slurm_cluster.conn_uri_json,
        PYTHONPATH=str(REPO),
    )
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env


def staging_handle(home: str) -> dict | None:
    """The job handle staging's task left in its XCom (its own database)."""
    import json

    with sqlite3.connect(f"file:{home}/airflow.db?mode=ro", uri=True, timeout=10) as db:
        row = db.execute("SELECT value FROM xcom WHERE task_id = ? AND key = 'slurm_job'", (TASK_ID,)).fetchone()
    if row is None:
        return None
    value = json.loads(row[0])
    return json.loads(value) if isinstance(value, str) else value


def test_staging_and_prod_run_the_same_dag_for_the_same_date_each_with_its_own_job(
    api, staging, cluster_ssh, wait_sacct, sacct_state
):
    api.wait_for_dag(DAG_ID)
    run_id = api.trigger(DAG_ID, conf={"seconds": 120}, run_id=RUN_ID, logical_date=f"{DATE}T00:00:00Z")
    assert run_id == RUN_ID
    api.wait_for_state(DAG_ID, RUN_ID, TASK_ID, {"deferred"}, timeout=120)
    prod = poll(lambda: api.xcom(DAG_ID, RUN_ID, TASK_ID, "slurm_job"), 30, "prod's job handle")

    log = Path(staging["AIRFLOW_HOME"]) / "dags-test.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [AIRFLOW, "dags", "test", DAG_ID, DATE], env=staging, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        theirs = poll(lambda: staging_handle(staging["AIRFLOW_HOME"]), 180, "staging's job handle", interval=1)
        assert theirs["job_id"] != prod["job_id"], "staging adopted prod's job"
        assert theirs["job_name"] != prod["job_name"]
        assert theirs["job_name"].rsplit("-", 2)[0] == prod["job_name"].rsplit("-", 2)[0]  # the same readable slug

        api.set_state(DAG_ID, RUN_ID, TASK_ID, "failed")  # prod's operator cancels prod's job, and only that
        assert wait_sacct(str(prod["job_id"]), ("CANCELLED",), timeout=60).startswith("CANCELLED")
        assert sacct_state(str(theirs["job_id"])) in ("PENDING", "RUNNING", "COMPLETED")

        assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_sacct(str(theirs["job_id"]), ("COMPLETED",), timeout=60) == "COMPLETED"
    output = log.read_text()
    assert "staging tick 20" in output and "tick 1 of" not in output  # staging's log shows staging's job
    assert f"Slurm job {prod['job_id']} " not in output
    prod_lines = api.log_lines(DAG_ID, RUN_ID, TASK_ID, 1)
    assert not [line for line in prod_lines if "staging tick" in line]  # prod's log shows prod's job only
