"""Helpers for the tests on dev/airflow's production shape: its metadata database and its triggerers."""

from __future__ import annotations

import shlex
import time

from sqlalchemy import Engine, create_engine, text

from tests.e2e.conftest import AirflowInstance

TRIGGERERS = ("triggerer-1", "triggerer-2")


def metadata_db(instance: AirflowInstance) -> Engine:
    """An engine on the deployment's PostgreSQL (the URL from `dev/airflow env`)."""
    out = instance.script("env").stdout
    url = next(
        shlex.split(line.split("=", 1)[1])[0]
        for line in out.splitlines()
        if line.startswith("export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=")
    )
    return create_engine(url, pool_pre_ping=True)


def triggerer_threshold(instance: AirflowInstance) -> float:
    """[triggerer] triggerer_health_check_threshold: after this long without a heartbeat, triggers move."""
    args = ("cli", "config", "get-value", "triggerer", "triggerer_health_check_threshold")
    return float(instance.script(*args).stdout)


def holder(db: Engine, dag_id: str, run_id: str, task_id: str) -> str | None:
    """The component (triggerer-1 / triggerer-2) whose triggerer job holds the task's trigger (dev/airflow
    names each component's job after it)."""
    query = text(
        "SELECT j.hostname FROM task_instance ti JOIN trigger t ON t.id = ti.trigger_id "
        "JOIN job j ON j.id = t.triggerer_id WHERE ti.dag_id = :d AND ti.run_id = :r AND ti.task_id = :t"
    )
    try:
        with db.connect() as conn:
            row = conn.execute(query, {"d": dag_id, "r": run_id, "t": task_id}).first()
    except Exception:  # PostgreSQL restarting
        return None
    return row[0] if row else None


def stall_holder(
    instance: AirflowInstance, db: Engine, dag_id: str, run_id: str, task_id: str, stalled: str, seconds: float
) -> str | None:
    """SIGSTOP the triggerer `stalled` for `seconds`, then SIGCONT it; the holder of the task's trigger just
    before the resume (the other triggerer once the health-check threshold has passed)."""
    instance.script("pause", stalled)
    try:
        time.sleep(seconds)
        return holder(db, dag_id, run_id, task_id)
    finally:
        instance.script("resume", stalled)
