"""The Compute page's GPU-hours: a row's, from its job's state (sacct's usage: a running job's so far) or, once the
task ended, from what it reported (XCom ``npa_usage``), and the total per DAG run. Pure functions.

XCom is writable by other tasks and by REST users: a reported value is read for its top-level ``gpu_hours`` only,
and anything but a finite number >= 0 there is shown as unknown, never as 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from npa_airflow.common import xcom_keys

if TYPE_CHECKING:
    from npa_airflow.compute.rows import ComputeRow, JobStatus

FROM_CLUSTER = "cluster"  # the state query's usage (sacct's AllocTRES x ElapsedRaw)
FROM_TASK = "task"  # the usage the task reported when it ended (every segment of its try)
ACTIVE_STATES = ("RUNNING", "PENDING")

NO_ANSWER = "the cluster did not answer"
NO_SLURM_RECORD = "the state query has no accounting record of the job's allocation"
NO_BURST_RECORD = "SkyPilot reports no GPU usage before the task ends"
REPORTED_NONE = "the task reported none (its log says why)"
MALFORMED = "the task's npa_usage XCom is malformed"
IGNORED = "the job handle is ignored"
EARLIER_SEGMENTS = "this try reported no usage of the run's earlier segments"


@dataclass(frozen=True)
class GpuHours:
    hours: float | None
    unknown: str | None = None  # why ``hours`` is None
    source: str | None = None  # FROM_CLUSTER or FROM_TASK when known

    def fields(self) -> dict[str, Any]:
        """The row's fields."""
        return {"gpu_hours": self.hours, "gpu_hours_unknown": self.unknown, "gpu_hours_from": self.source}


def gpu_hours_in(usage: Any) -> float | None:
    """The top-level ``gpu_hours`` of a usage dict (`JobUsage.to_dict`, XCom ``npa_usage``); None unless it is a
    finite number >= 0."""
    hours = usage.get("gpu_hours") if isinstance(usage, Mapping) else None
    if isinstance(hours, (int, float)) and not isinstance(hours, bool) and math.isfinite(hours) and hours >= 0:
        return float(hours)
    return None


def row_gpu_hours(status: JobStatus | None, reported: Mapping[str, Any], no_record: str, segment: int = 1) -> GpuHours:
    """A job's GPU-hours: the task's report once the job is not seen queued or running (the report covers the
    whole try), else the state query's usage, plus for a later segment of a long run what the task reported when
    the earlier ones ended; ``no_record`` says why a state without usage is unknown."""
    active = status is not None and status.state in ACTIVE_STATES
    if not active and xcom_keys.USAGE in reported:
        value = reported[xcom_keys.USAGE]
        hours = gpu_hours_in(value)
        if hours is not None:
            return GpuHours(hours, source=FROM_TASK)
        return GpuHours(None, REPORTED_NONE if value is None else MALFORMED)
    if status is None:
        return GpuHours(None, NO_ANSWER)
    hours = gpu_hours_in(status.usage)
    if hours is None:
        return GpuHours(None, no_record)
    if segment > 1:
        earlier = gpu_hours_in(reported.get(xcom_keys.USAGE))
        if earlier is None:
            return GpuHours(None, EARLIER_SEGMENTS)
        hours += earlier
    return GpuHours(hours, source=FROM_CLUSTER)


@dataclass
class RunTotal:
    dag_id: str
    run_id: str
    jobs: int = 0
    gpu_hours: float | None = None  # the sum of the known values; None when none is known
    unknown: int = 0  # jobs whose GPU-hours are unknown (not in the sum)


def run_totals(rows: Iterable[ComputeRow]) -> list[dict[str, Any]]:
    """Per DAG run: its jobs, the sum of their known GPU-hours, and how many are unknown."""
    totals: dict[tuple[str, str], RunTotal] = {}
    for row in rows:
        entry = totals.setdefault((row.dag_id, row.run_id), RunTotal(row.dag_id, row.run_id))
        entry.jobs += 1
        if row.gpu_hours is None:
            entry.unknown += 1
        else:
            entry.gpu_hours = (entry.gpu_hours or 0.0) + row.gpu_hours
    return [asdict(totals[key]) for key in sorted(totals)]
