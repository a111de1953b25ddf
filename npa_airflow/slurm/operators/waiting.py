"""How long a step waits for its job, and the wait itself where the task does not defer.

The trigger's deadline counts from the job's submission as Slurm recorded it (an adopted job keeps its first
submission time), and from a continued run's first segment when the author bounded the wait (`max_wait`,
`execution_timeout`); without such a bound each job may queue `DEFAULT_PENDING_ALLOWANCE` past its wall time.
Airflow's own deferral timeout stays well behind the deadline: it would drop the trigger without cancelling the job,
whereas the deadline fires an event the operator turns into a cancel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

DEFAULT_PENDING_ALLOWANCE = timedelta(hours=24)
DEFER_TIMEOUT_MARGIN_SECONDS = 600.0


def trigger_deadline(
    *,
    max_wait: timedelta | None,
    execution_timeout: timedelta | None,
    wall_seconds: float | None,
    submitted_at: float | None,
    counted_from: float | None = None,
) -> float:
    """Epoch seconds at which the wait for a job submitted at `submitted_at` ends (`counted_from`: a continued
    run's first submission)."""
    bound = max_wait if max_wait is not None else execution_timeout
    if bound is not None:
        return (counted_from or submitted_at or time.time()) + bound.total_seconds()
    return (submitted_at or time.time()) + (wall_seconds or 0) + DEFAULT_PENDING_ALLOWANCE.total_seconds()


def defer_timeout(deadline: float | None) -> timedelta | None:
    """Airflow's deferral timeout for a trigger with `deadline`: behind it by DEFER_TIMEOUT_MARGIN_SECONDS."""
    if deadline is None:
        return None
    return timedelta(seconds=max(0.0, deadline - time.time()) + DEFER_TIMEOUT_MARGIN_SECONDS)


def wait_here(trigger: Any, log: logging.Logger) -> dict[str, Any]:
    """Non-deferrable: run the trigger (and the shared poller) on this worker until its event; its payload."""
    trigger._log = log  # the job's output goes to this task's log

    async def first_event() -> Any:
        gen = trigger.run()
        try:
            return await anext(gen)
        finally:
            await gen.aclose()

    return asyncio.run(first_event()).payload
