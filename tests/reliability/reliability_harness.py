"""Helpers for the fault tests: drive operators and triggers directly with a task-instance context, read the
cluster's own accounting, and record the figures (injections, jobs, losses) each test measured."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Re-exported for the reliability tests, which import their helpers from this module.
from tests.harness.airflow_tasks import collecting_logger, submit_deferred  # noqa: F401
from tests.harness.airflow_tasks import make_submit_operator as make_operator  # noqa: F401
from tests.harness.airflow_tasks import task_context as context  # noqa: F401
from tests.harness.slurm_accounting import sacct_jobs

REPO = Path(__file__).resolve().parents[2]
FIGURES = Path(os.environ.get("NPA_RELIABILITY_FIGURES", REPO / ".artifacts" / "reliability-figures.json"))


def record_figures(fault: str, **figures: Any) -> None:
    """Append one fault's measured figures to the figures file (read when updating docs/reliability.md)."""
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    data[fault] = {**figures, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    FIGURES.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def unique_dag(prefix: str) -> str:
    return f"npa_rel_{prefix}_{uuid.uuid4().hex[:6]}"


def squeue_jobs(cluster_ssh: Callable[..., Any], name_prefix: str) -> list[dict[str, str]]:
    out = cluster_ssh("squeue -h -t all -o '%i|%j|%T'", check=True).stdout
    return [
        {"id": p[0], "name": p[1], "state": p[2]}
        for p in (line.split("|") for line in out.splitlines())
        if len(p) == 3 and p[1].startswith(name_prefix)
    ]


def _merged(cluster_ssh: Callable[..., Any], name_prefix: str) -> dict[str, dict[str, str]]:
    """sacct's records (with nodes and final states), plus squeue's for jobs accounting has not seen yet."""
    merged = {j["id"]: j for j in sacct_jobs(cluster_ssh, name_prefix)}
    for job in squeue_jobs(cluster_ssh, name_prefix):
        merged.setdefault(job["id"], job)
    return merged


def jobs_settled(cluster_ssh: Callable[..., Any], name_prefix: str, expected: int, timeout: float = 45) -> list:
    """Jobs by name from squeue and sacct merged by id, once accounting has caught up (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        merged = _merged(cluster_ssh, name_prefix)
        if len(merged) >= expected or time.monotonic() > deadline:
            time.sleep(2)  # a late duplicate would show up by now
            return sorted(_merged(cluster_ssh, name_prefix).values(), key=lambda j: j["id"])
        time.sleep(1)


async def run_trigger(trigger: Any, logger: logging.Logger, timeout: float) -> Any:
    """Run a trigger until its first event, with ``logger`` as its task log."""
    trigger._log = logger
    gen = trigger.run()
    try:
        return await asyncio.wait_for(anext(gen), timeout)
    finally:
        await gen.aclose()


RUNNER = """
import json, runpy, sys
from sqlalchemy import select
ns = runpy.run_path(sys.argv[1])
dag = ns["dag"]
run = dag.test()
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
out = {}
with create_session() as session:
    for ti in run.get_task_instances(session=session):
        rows = session.scalars(
            select(XComModel).where(
                XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id,
                XComModel.task_id == ti.task_id, XComModel.key == "slurm_job",
            )
        ).all()
        handle = rows[-1].value if rows else None
        if isinstance(handle, str):
            handle = json.loads(handle)
        out[ti.task_id] = {"state": str(ti.state), "try_number": ti.try_number, "handle": handle}
print("NPA_RESULT " + json.dumps(out))
"""


def airflow_home(base: Path, **connections: dict) -> dict[str, str]:
    """Environment for a dag.test() subprocess with its own AIRFLOW_HOME under ``base`` (migrated)."""
    import subprocess
    import sys

    base.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(
        AIRFLOW_HOME=str(base),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(base / "dags"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{base}/airflow.db",
        PYTHONPATH=str(REPO),
    )
    env.pop("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", None)
    for conn_id, value in connections.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(value)
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env


def run_dag_test(env: dict[str, str], dag_source: str, timeout: float = 600) -> tuple[dict, str]:
    """Run ``dag.test()`` of the DAG (variable ``dag``) in ``dag_source``; return per-task results and output."""
    import subprocess
    import sys

    home = Path(env["AIRFLOW_HOME"])
    (home / "dags").mkdir(exist_ok=True)
    dag_file = home / "dags" / f"dag_{uuid.uuid4().hex[:6]}.py"
    dag_file.write_text(dag_source)
    runner = home / "run_dag_test.py"
    runner.write_text(RUNNER)
    proc = subprocess.run(
        [sys.executable, str(runner), str(dag_file)], env=env, capture_output=True, text=True, timeout=timeout
    )
    output = proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("NPA_RESULT ")]
    assert lines, f"dag.test() gave no result (rc {proc.returncode}):\n{output[-6000:]}"
    return json.loads(lines[-1].split(" ", 1)[1]), output
