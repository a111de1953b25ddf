"""The events a `SlurmJobTrigger` fires: their statuses, the shape of common/trigger_events.py with the job's id
beside its handle, and the job's usage they carry (the GPU-hours line the task logs)."""

from __future__ import annotations

from typing import Any

from npa_airflow.common.trigger_events import EVENT_KEYS, check_event, make_event
from npa_airflow.common.usage import ENDED_FIRST as ENDED_FIRST
from npa_airflow.common.usage import event_usage as event_usage  # the events' usage (common: Burst's too)
from npa_airflow.common.usage import usage_line as usage_line
from npa_airflow.slurm.commands.records import SlurmJobInfo
from npa_airflow.slurm.handle import SlurmJobHandle

# "unsatisfiable": PENDING on a reason waiting never clears (npa_airflow.slurm.submit.fit.NEVER_CLEARING_REASONS).
# "vanished": neither sacct nor squeue has known the job for `vanished_after` seconds.
# "continue": a segment of a long run ended with its continue file (npa_airflow.slurm.operators.segments).
EVENT_STATUSES = (
    "success",
    "failed",
    "canceled",
    "marker_missing",
    "deadline",
    "held_by_qos",
    "unsatisfiable",
    "vanished",
    "continue",
)


def make_event_payload(status: str, handle: dict[str, Any], message: str, **extra: Any) -> dict[str, Any]:
    """The one shape of every event this trigger fires (validated by `validate_event`)."""
    return make_event("Slurm", EVENT_STATUSES, status, handle, message, job_id=str(handle["job_id"]), **extra)


def validate_event(event: Any) -> dict[str, Any]:
    """Check an event before the operator acts on it; raise ValueError naming what is wrong."""
    event = check_event(event, "Slurm", EVENT_STATUSES, keys=(*EVENT_KEYS, "job_id"))
    if not isinstance(event["handle"], dict) or str(event["handle"].get("job_id")) != str(event["job_id"]):
        raise ValueError(f"Slurm trigger event's handle does not match job {event['job_id']!r}: {event!r}")
    return event


def event_handle(event: dict[str, Any]) -> SlurmJobHandle:
    """The job handle a checked event carries (as a dict), validated like a new one: read it once, then use it."""
    return SlurmJobHandle.from_dict(event["handle"])


# Why an event's usage is None (its `usage_unknown`).
NO_ACCOUNTING = "the cluster keeps no accounting"
NO_RECORD = "accounting has no record of the job's allocation"


def usage_fields(info: SlurmJobInfo | None, *, accounting: bool) -> dict[str, Any]:
    """What an event says of the job's usage: `usage` (:meth:`JobUsage.to_dict`, or None) and, when None,
    `usage_unknown` (why). `info` is the job's last record; `accounting` False: the cluster keeps none."""
    if info is not None and info.usage is not None:
        return {"usage": info.usage.to_dict()}
    return {"usage": None, "usage_unknown": NO_RECORD if accounting else NO_ACCOUNTING}
