"""What `dev/demo` ran, for a reader new to Airflow: each task, its state, its job, and where its log and results are.

Run by dev/demo after `airflow dags test` with the demo's AIRFLOW_HOME: reads the DAG's latest run from the
metadata DB and the job handles its tasks left in XCom (`slurm_job`, `burst_job`).
    .venv/bin/python dev/demo_summary.py DAG_ID
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    state: str
    try_number: int
    log_file: str | None
    slurm: dict[str, Any] | None = None  # the `slurm_job` handle
    burst: dict[str, Any] | None = None  # the `burst_job` handle


def describe_job(row: TaskRow, accounting: bool = True) -> list[str]:
    """The lines about a task's job: Slurm id and where its output and results are, or the SkyPilot cluster.
    Without `accounting` (no sacct), the job is looked up in slurmctld, which keeps it for MinJobAge."""
    if row.slurm:
        job = row.slurm
        cluster = f" on cluster {job['cluster']}" if job.get("cluster") else ""
        look = f"sacct -j {job['job_id']}" if accounting else f"scontrol show job {job['job_id']}"
        return [
            f"Slurm job {job['job_id']} ({job['job_name']}){cluster}: `{look}`",
            f"output   {job['stdout_path']}",
            f"results  {job['results_dir']}",
        ]
    if row.burst:
        job = row.burst
        on = f"job {job['job_id']} on " if job.get("job_id") is not None else ""
        return [f"SkyPilot {on}cluster {job['cluster']} (torn down at the end unless pinned)"]
    return []


def render(dag_id: str, run_id: str, run_state: str, rows: list[TaskRow], accounting: bool = True) -> str:
    lines = ["", f"== {dag_id}: run {run_id} {run_state.upper()} =="]
    width = max((len(r.task_id) for r in rows), default=0)
    for row in rows:
        tries = f" (try {row.try_number})" if row.try_number > 1 else ""
        lines.append(f"  {row.task_id:<{width}}  {row.state}{tries}")
        lines += [f"  {'':<{width}}    {line}" for line in describe_job(row, accounting)]
        if row.log_file:
            lines.append(f"  {'':<{width}}    task log {row.log_file}")
    if any(row.slurm for row in rows):
        lines.append('  (Slurm commands on the local cluster: eval "$(dev/cluster env)" first)')
    return "\n".join(lines)


def _xcom(session: Any, ti: Any, key: str) -> dict[str, Any] | None:
    from airflow.models.xcom import XComModel

    value = session.scalar(
        XComModel.get_many(
            key=key, dag_ids=ti.dag_id, run_id=ti.run_id, task_ids=ti.task_id, map_indexes=ti.map_index
        ).with_only_columns(XComModel.value)
    )
    while isinstance(value, str):  # stored as JSON text (sometimes twice encoded)
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _log_file(home: Path, ti: Any) -> str | None:
    folder = home / "logs" / f"dag_id={ti.dag_id}" / f"run_id={ti.run_id}" / f"task_id={ti.task_id}"
    files = sorted(folder.glob("**/attempt=*.log"), key=lambda p: p.stat().st_mtime)
    return str(files[-1]) if files else None


def main(dag_id: str) -> int:
    import os

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    home = Path(os.environ["AIRFLOW_HOME"])
    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(1))
        if run is None:
            print(f"no run of {dag_id} in {home}", file=sys.stderr)
            return 1
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id)
        ).all()
        rows = [
            TaskRow(
                task_id=ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]",
                state=str(ti.state or "none"),
                try_number=ti.try_number or 1,
                log_file=_log_file(home, ti),
                slurm=_xcom(session, ti, "slurm_job"),
                burst=_xcom(session, ti, "burst_job"),
            )
            for ti in sorted(tis, key=lambda t: (t.start_date is None, t.start_date, t.task_id))
        ]
        accounting = os.environ.get("NPA_SLURM_ACCOUNTING") != "none"  # dev/cluster env names the bed's mode
        print(render(dag_id, run.run_id, str(run.state), rows, accounting))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
