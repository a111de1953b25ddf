"""The events a `SlurmJobTrigger` fires: their statuses, their one shape, and the check the operator makes."""

from __future__ import annotations

from typing import Any

# "unsatisfiable": PENDING on a reason waiting never clears (npa_airflow.slurm.fit.NEVER_CLEARING_REASONS).
# "vanished": neither sacct nor squeue has known the job for `vanished_after` seconds.
EVENT_STATUSES = (
    "success",
    "failed",
    "canceled",
    "marker_missing",
    "deadline",
    "held_by_qos",
    "unsatisfiable",
    "vanished",
)


def make_event_payload(status: str, handle: dict[str, Any], message: str, **extra: Any) -> dict[str, Any]:
    """The one shape of every event this trigger fires (validated by `validate_event`)."""
    if status not in EVENT_STATUSES:
        raise ValueError(f"unknown Slurm trigger event status {status!r}; expected one of {EVENT_STATUSES}")
    return {"status": status, "job_id": str(handle["job_id"]), "handle": handle, "message": message, **extra}


def validate_event(event: Any) -> dict[str, Any]:
    """Check an event before the operator acts on it; raise ValueError naming what is wrong."""
    if not isinstance(event, dict):
        raise ValueError(f"Slurm trigger event must be a dict, got {type(event).__name__}: {event!r}")
    missing = [k for k in ("status", "job_id", "handle", "message") if k not in event]
    if missing:
        raise ValueError(f"Slurm trigger event lacks {missing}: {event!r}")
    if event["status"] not in EVENT_STATUSES:
        raise ValueError(f"Slurm trigger event has unknown status {event['status']!r}; expected {EVENT_STATUSES}")
    if not isinstance(event["handle"], dict) or str(event["handle"].get("job_id")) != str(event["job_id"]):
        raise ValueError(f"Slurm trigger event's handle does not match job {event['job_id']!r}: {event!r}")
    return event
