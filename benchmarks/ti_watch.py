"""When each mapped task instance of a benchmark run deferred, left the deferred state and succeeded, read by
polling the metadata database (state, start and end dates) twice a second.

Airflow keeps no time stamp of a trigger firing; the first poll that no longer sees the task deferred bounds
it from above (the poll period is the resolution, stated with the figures).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

TERMINAL = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
_QUERY = text(
    "SELECT map_index, state, start_date, end_date FROM task_instance "
    "WHERE dag_id = :dag AND run_id = :run AND task_id = :task AND map_index >= 0"
)


@dataclass
class TiTimes:
    """What one mapped task instance did, in epoch seconds (None: not seen yet)."""

    state: str | None = None
    start: float | None = None  # start_date of the current try (execute began on a worker)
    deferred_seen: float | None = None  # first poll that saw it deferred
    left_deferred_seen: float | None = None  # first poll that saw it past deferred (its trigger fired)
    end: float | None = None  # end_date once it has finished


@dataclass
class RunTimes:
    tis: dict[int, TiTimes] = field(default_factory=dict)

    def observe(self, rows: Iterable[Sequence[object]], now: float) -> None:
        """Fold one poll's rows (map_index, state, start_date, end_date) into the per-instance times."""
        for map_index, state, start, end in rows:
            ti = self.tis.setdefault(int(map_index), TiTimes())  # type: ignore[call-overload]
            ti.state = None if state is None else str(state)
            if start is not None and ti.deferred_seen is None:  # the try's start, before any resume
                ti.start = _epoch(start)
            if ti.state == "deferred" and ti.deferred_seen is None:
                ti.deferred_seen = now
            elif ti.deferred_seen is not None and ti.state != "deferred" and ti.left_deferred_seen is None:
                ti.left_deferred_seen = now
            if ti.state in TERMINAL and end is not None:
                ti.end = _epoch(end)

    def count(self, *states: str) -> int:
        return sum(1 for ti in self.tis.values() if ti.state in states)

    def all_deferred_at(self, n: int) -> float | None:
        """When the last of the n instances was first seen deferred (None until all have been)."""
        seen = [ti.deferred_seen for ti in self.tis.values() if ti.deferred_seen is not None]
        return max(seen) if len(seen) == n and n > 0 else None


def _epoch(value: object) -> float:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return value.timestamp()
    return float(value)  # type: ignore[arg-type]


def poll_once(db: Engine, run_times: RunTimes, run_id: str, task_id: str, dag_id: str) -> None:
    with db.connect() as conn:
        rows = conn.execute(_QUERY, {"dag": dag_id, "run": run_id, "task": task_id}).fetchall()
    run_times.observe(rows, time.time())


def latency_stats(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(p50, p95, max) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]

    return rank(0.50), rank(0.95), ordered[-1]
