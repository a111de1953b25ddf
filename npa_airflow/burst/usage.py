"""A Burst job's GPU-hours from the SkyPilot API server's job queue record (``POST /queue``, one record a job).

SkyPilot 0.14.1 answers, for a finished job of ``num_nodes: 2`` and ``accelerators: GPU:2``::

    {"job_id": 1, "submitted_at": 1796474687.05, "start_at": 1796474691.99, "end_at": 1796474704.47,
     "resources": "2x[GPU:2]", "status": "SUCCEEDED", ...}

``start_at`` is when the job first turned RUNNING (-1 until then), ``end_at`` when it reached a terminal state
(null until then); ``resources`` is ``<nodes>x[<accelerator>:<count per node>]`` (``[CPU:<n>]`` without
accelerators). The run time is ``end_at - start_at``; GPUs are the count per node times the nodes.
"""

from __future__ import annotations

import re
from typing import Any

from npa_airflow.common.usage import JobUsage

# "2x[GPU:2]", "1x[H100:8]", "4x[CPU:1+]"; managed jobs add "[Spot]".
_RESOURCES = re.compile(r"(\d+)x\[([^\]]*)\]")
_ACCELERATOR = re.compile(r"([^:,\s]+):([0-9.]+)\+?")

NO_RECORD = "the API server's job queue has no record of the job"
NOT_ENDED = "the job queue records no end of the job"


def resources_gpus(resources: Any) -> tuple[int, int] | None:
    """``(GPUs of every node together, nodes)`` from a queue record's ``resources``; None when it cannot say."""
    match = _RESOURCES.match(resources) if isinstance(resources, str) else None
    if match is None:
        return None
    nodes, per_node = int(match.group(1)), 0.0
    for name, count in _ACCELERATOR.findall(match.group(2)):
        if name.upper() != "CPU":
            per_node += float(count)
    if not per_node.is_integer():
        return None  # a fraction of a GPU: SkyPilot shares it, the hours are not whole GPUs'
    return int(per_node) * nodes, nodes


def record_usage(record: Any) -> tuple[JobUsage | None, str]:
    """The job's usage from its queue record (``parse_queue_record``), or None and why it is unknown."""
    if not isinstance(record, dict):
        return None, NO_RECORD
    counted = resources_gpus(record.get("resources"))
    if counted is None:
        return None, f"the job queue's resources {record.get('resources')!r} do not say the GPUs"
    start, end = record.get("start_at"), record.get("end_at")
    if not _is_time(end):
        return None, NOT_ENDED
    gpus, nodes = counted
    if not _is_time(start) or start < 0:  # never RUNNING (cancelled or failed before it started)
        return JobUsage(gpus, nodes, 0), ""
    return JobUsage(gpus, nodes, max(0, round(end - start))), ""


def usage_fields(record: Any, unknown: str | None = None) -> dict[str, Any]:
    """What a Burst event says of the job's usage: ``usage`` (:meth:`JobUsage.to_dict`, or None) and, when None,
    ``usage_unknown`` (why). ``unknown`` (the record could not be read) wins over the record."""
    usage, why = (None, unknown) if unknown else record_usage(record)
    return {"usage": usage.to_dict()} if usage is not None else {"usage": None, "usage_unknown": why}


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
