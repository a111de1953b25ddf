"""Pure: whether a request can ever run on a partition, and which pending reasons never clear by waiting.

Both feed the same promise: a job that cannot run is refused (before submit) or failed (while pending) with
Slurm's reason and what to change, instead of waiting out its deadline. See docs/reliability.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands.records import NodeInfo, PartitionInfo

# Pending reasons that waiting never clears: only changing the request (or the cluster's configuration) does.
# Deliberately absent: Resources, Priority, ReqNodeNotAvail (nodes down/drained/reserved come back),
# Reservation, Dependency, held jobs, and aggregate limits (AssocGrp*, AssocMaxJobsLimit, QOSMaxJobsPerUser*,
# QOSGrp*): they clear when other jobs end. Per-job limits never do.
NEVER_CLEARING_REASONS: Mapping[str, str] = {
    "PartitionConfig": "the request does not fit the partition's configuration (nodes, GPUs, memory, CPUs)",
    "PartitionNodeLimit": "the node count is outside the partition's MinNodes/MaxNodes",
    "PartitionTimeLimit": "the time limit exceeds the partition's MaxTime",
    "BadConstraints": "no node has the requested features (--constraint) with these resources",
    "DependencyNeverSatisfied": "a dependency can never be satisfied",
    "InvalidAccount": "the account is invalid",
    "InvalidQOS": "the QOS is invalid",
    "AssocMaxNodesPerJobLimit": "the node count exceeds the association's per-job limit",
    "AssocMaxWallDurationPerJobLimit": "the time limit exceeds the association's per-job limit",
    "AssocMaxGRESPerJob": "the GPUs exceed the association's per-job limit",
    "QOSMaxNodePerJobLimit": "the node count exceeds the QOS per-job limit",
    "QOSMaxWallDurationPerJobLimit": "the time limit exceeds the QOS per-job limit",
    "QOSMaxGRESPerJob": "the GPUs exceed the QOS per-job limit",
}

_MEM_RE = re.compile(r"--mem=(\d+)([KMGT]?)", re.IGNORECASE)
_MEM_UNIT_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def never_clearing_reason(reason: str | None) -> str | None:
    """The reason's token when it can never clear ("BadConstraints"), else None; reads "Reason, details"."""
    token = (reason or "").split(",", 1)[0].strip()
    return token if token in NEVER_CLEARING_REASONS else None


def mem_mb_of(extra_sbatch: Sequence[str]) -> int | None:
    """The per-node memory of a ``--mem=`` option (MB, Slurm's default unit), if any."""
    for option in extra_sbatch:
        m = _MEM_RE.fullmatch(option)
        if m:
            return max(1, int(int(m.group(1)) * _MEM_UNIT_MB[m.group(2).upper()]))
    return None


@dataclass(frozen=True)
class Request:
    nodes: int
    gpus_per_node: int = 0
    mem_mb: int | None = None


def misfit(request: Request, partition: PartitionInfo, nodes: Mapping[str, NodeInfo]) -> str | None:
    """Why ``request`` can never run on ``partition`` (whose nodes are in ``nodes``), or None if it can."""
    name = partition.name
    if partition.max_nodes is not None and request.nodes > partition.max_nodes:
        return (
            f"nodes={request.nodes} exceeds partition {name!r}'s MaxNodes={partition.max_nodes}; "
            "lower nodes or choose another partition"
        )
    members = [n for n in nodes.values() if name in n.partitions]
    total = partition.total_nodes if partition.total_nodes is not None else len(members) or None
    if total is not None and request.nodes > total:
        return f"nodes={request.nodes} but partition {name!r} has {total} node(s); lower nodes or choose another"
    if not members:
        return None  # nothing known about the nodes: leave the rest to Slurm
    fitting = [
        n
        for n in members
        if n.gpus >= request.gpus_per_node
        and (request.mem_mb is None or n.real_memory_mb is None or n.real_memory_mb >= request.mem_mb)
    ]
    if len(fitting) >= request.nodes:
        return None
    most_gpus = max(n.gpus for n in members)
    memories = [n.real_memory_mb for n in members if n.real_memory_mb is not None]
    asked = f"{request.nodes} node(s) with {request.gpus_per_node} GPU(s)"
    if request.mem_mb is not None:
        asked += f" and {request.mem_mb} MB of memory"
    return (
        f"{asked} each, but only {len(fitting)} of partition {name!r}'s {len(members)} node(s) have that "
        f"(at most {most_gpus} GPU(s) per node (Gres), at most {max(memories, default=0)} MB (RealMemory)); "
        "lower gpus_per_node / --mem / nodes or choose another partition"
    )


def refuse_misfit(
    request: Request, partitions: Sequence[PartitionInfo], nodes: Mapping[str, NodeInfo], conn_id: str
) -> None:
    """Refuse a request no partition of the job can ever run (it would pend until its deadline)."""
    reasons = [misfit(request, part, nodes) for part in partitions]
    if all(reasons):
        raise NpaValidationError(
            f"this job can never start on the cluster of connection {conn_id!r}: "
            f"{'; '.join(r for r in reasons if r)}. Nothing was submitted."
        )
