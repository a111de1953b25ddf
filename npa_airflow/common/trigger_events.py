"""The one shape of a trigger's event, Slurm's and Burst's: a dict with ``status`` (one of the backend's
statuses), ``handle`` (the job handle's dict), ``message`` and what the backend adds; each backend's event
module (``slurm/watch/trigger_events.py``, ``burst/watch.py``) builds and checks its events here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EVENT_KEYS = ("status", "handle", "message")


def make_event(backend: str, statuses: Sequence[str], status: str, handle: Any, message: str, **extra: Any) -> dict:
    """An event of `backend` ("Slurm", "burst"), refused when `status` is not one of its `statuses`."""
    if status not in statuses:
        raise ValueError(f"unknown {backend} trigger event status {status!r}; expected one of {statuses}")
    return {"status": status, "handle": handle, "message": message, **extra}


def check_event(event: Any, backend: str, statuses: Sequence[str], keys: Sequence[str] = EVENT_KEYS) -> dict:
    """The event, once it is a dict with `keys` and a known status; a ValueError naming what is wrong otherwise."""
    if not isinstance(event, dict):
        raise ValueError(f"{backend} trigger event must be a dict, got {type(event).__name__}: {event!r}")
    missing = [k for k in keys if k not in event]
    if missing:
        raise ValueError(f"{backend} trigger event lacks {missing}: {event!r}")
    if event["status"] not in statuses:
        raise ValueError(f"{backend} trigger event has unknown status {event['status']!r}; expected {statuses}")
    return event
