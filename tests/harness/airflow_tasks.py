"""Driving an operator and its trigger by hand, as Airflow would: a task instance's context, a Slurm submit
operator with small defaults, `execute` up to its deferral, and the lines a trigger or operator logs."""

from __future__ import annotations

import logging
import types
import uuid
from typing import Any

import pytest


def task_context(dag_id: str, try_number: int = 1, run_id: str | None = None, task_id: str = "train") -> dict:
    """A task-instance context for driving an operator directly: identity, and `xcom_push` into `ti.pushed`."""
    pushed: dict[str, Any] = {}
    ti = types.SimpleNamespace(
        id=uuid.uuid4(),
        dag_id=dag_id,
        task_id=task_id,
        run_id=run_id or f"manual__{uuid.uuid4().hex[:8]}",
        map_index=-1,
        try_number=try_number,
        pushed=pushed,
    )
    ti.xcom_push = lambda key, value: pushed.__setitem__(key, value)
    return {"ti": ti}


def job_name(dag_id: str, task_id: str, run_id: str, map_index: int | None, try_number: int) -> str:
    """The job name the operators give this try in the tests' deployment (tests/conftest.py)."""
    from npa_airflow.common.deployment import current_deployment
    from npa_airflow.common.naming import job_name_for

    return job_name_for(dag_id, task_id, run_id, map_index, try_number, deployment=current_deployment())


def make_submit_operator(**kwargs: Any) -> Any:
    """A `SlurmSubmitOperator` for the local cluster's CPU partition (one CPU, 6 min), overridable."""
    from npa_airflow.slurm.operators import SlurmSubmitOperator

    defaults: dict[str, Any] = dict(
        task_id="train", partition="cpu", gpus_per_node=0, cpus_per_task=1, time_hours=0.1, poll_interval=2
    )
    defaults.update(kwargs)
    return SlurmSubmitOperator(**defaults)


def submit_deferred(op: Any, ctx: dict) -> Any:
    """Run execute() up to its deferral; return the trigger it deferred with."""
    from airflow.sdk.exceptions import TaskDeferred

    op.render_template_fields(ctx)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return deferred.value.trigger


class LineCollector(logging.Handler):
    """Keeps every formatted message it receives, in order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def collecting_logger(name: str) -> tuple[logging.Logger, LineCollector]:
    """A fresh logger (unique per call, not propagated) whose lines end up in the returned collector."""
    logger = logging.getLogger(f"npa.test.{name}.{uuid.uuid4().hex[:6]}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handler = LineCollector()
    logger.addHandler(handler)
    return logger, handler
