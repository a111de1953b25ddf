"""Driving an operator and its trigger by hand, as Airflow would: run `execute` up to its deferral, and collect
the lines a trigger or operator logs."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest


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
