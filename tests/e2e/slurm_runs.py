"""Helpers for runs of the Slurm test DAG: trigger until DEFERRED, read the remote job's lines from the log."""

from __future__ import annotations

import os
import re

from tests.e2e.airflow_api import AirflowApi, poll

# "trigger": the same tests on the DAGs whose tasks start in the triggerer (start_from_trigger=True, the dag ids
# with "_trigger"); "worker" (the default): on those that start on a Celery worker. dev/test runs both.
START_MODE = os.environ.get("NPA_E2E_START", "worker")
if START_MODE not in ("worker", "trigger"):
    raise ValueError(f"NPA_E2E_START={START_MODE!r}: 'worker' or 'trigger'")
IN_TRIGGERER = START_MODE == "trigger"


def mode_dag(dag_id: str) -> str:
    """The test DAG `dag_id` of this session's start mode."""
    return f"{dag_id}_trigger" if IN_TRIGGERER else dag_id


DAG_ID = mode_dag("npa_e2e_slurm")
TASK_ID = "ticker"
TICK = re.compile(r"^tick (\d+) of (\d+)$")


def ticks(lines: list[str]) -> list[int]:
    """The tick numbers the remote job printed, in the order the task log shows them."""
    return [int(m.group(1)) for line in lines if (m := TICK.match(line.strip()))]


def start_job(api: AirflowApi, seconds: int) -> tuple[str, dict, str]:
    """Trigger a run, wait until the task is DEFERRED with its handle in XCom; return (run id, ti, job id)."""
    api.wait_for_dag(DAG_ID)
    run_id = api.trigger(DAG_ID, conf={"seconds": seconds})
    ti = api.wait_for_state(DAG_ID, run_id, TASK_ID, {"deferred"}, timeout=120)
    handle = poll(lambda: api.xcom(DAG_ID, run_id, TASK_ID, "slurm_job"), 30, "the job handle in XCom")
    return run_id, ti, str(handle["job_id"])


def wait_for_ticks(api: AirflowApi, run_id: str, try_number: int, at_least: int, timeout: float = 90) -> list[str]:
    def probe():
        lines = api.log_lines_while_unfinished(DAG_ID, run_id, TASK_ID, try_number)
        return lines if len(ticks(lines)) >= at_least else None

    return poll(probe, timeout, f"{at_least} ticks of the remote job in the task log", interval=1)
