"""Pure readers of Airflow 3's structured (JSON lines) task and trigger logs: when a task's try began on the
worker, when it paused as DEFERRED, and when its trigger fired. Exact where the database only has states."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

DEFERRED_EVENT = "Pausing task as DEFERRED"
FIRED_EVENT = "Trigger fired event"


def _events(text: str) -> list[tuple[float, str]]:
    events = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
            stamp = dt.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        events.append((stamp, str(record.get("event", ""))))
    return events


def deferral_span(task_log: str) -> tuple[float, float] | None:
    """(first event, first "Pausing task as DEFERRED") of a task log: the worker's part of the submission."""
    events = _events(task_log)
    deferred = next((t for t, e in events if e.startswith(DEFERRED_EVENT)), None)
    return (events[0][0], deferred) if events and deferred is not None else None


def fired_at(trigger_log: str) -> float | None:
    """When the trigger fired its event (Airflow's "Trigger fired event" line), else None."""
    return next((t for t, e in _events(trigger_log) if e.startswith(FIRED_EVENT)), None)


def read_try_logs(ti_dir: Path, try_number: int = 1) -> tuple[str, str]:
    """(task log, every trigger log of that try joined) of one mapped task instance; empty when missing."""

    def read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    task = read(ti_dir / f"attempt={try_number}.log")
    triggers = "\n".join(read(p) for p in sorted(ti_dir.glob(f"attempt={try_number}.log.trigger.*.log")))
    return task, triggers
