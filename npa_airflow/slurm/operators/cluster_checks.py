"""Read-only checks of a prepared job against the cluster before anything is written: the inputs exist, the
partition exists, allows the wall time and can ever hold the request (nodes, GPUs and memory per node)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators.outage import cluster_read
from npa_airflow.slurm.submit.fit import Request, refuse_misfit

if TYPE_CHECKING:
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.job import PreparedJob


def check_on_cluster(hook: SlurmHook, job: PreparedJob, conn_id: str, log: logging.Logger) -> None:
    """Refuse `job` when the cluster of connection `conn_id` cannot run it (each read rides out an outage)."""
    check_inputs(hook, job, log)
    if job.partition is None and job.time_minutes is None and job.nodes is None:
        return
    nodes: dict[str, Any] | None = None
    if job.nodes is None:
        partitions = cluster_read(log, "reading partitions", hook.partitions)
    else:  # the fit check needs the nodes too: both in one round trip
        partitions, nodes = cluster_read(log, "reading partitions and nodes", hook.cluster_layout)
    name = job.partition or next((p.name for p in partitions.values() if p.default), None)
    if name is None:
        return
    for part in name.split(","):
        info = partitions.get(part)
        if info is None:
            raise NpaValidationError(
                f"partition {part!r} does not exist on the cluster of connection {conn_id!r}; "
                f"known partitions: {', '.join(sorted(partitions)) or 'none'}"
            )
        limit = info.max_time_minutes
        if limit is not None and job.time_minutes is not None and job.time_minutes > limit:
            raise NpaValidationError(
                f"time_hours asks for {job.time_minutes} min but partition {part!r} allows at most {limit} min "
                "(MaxTime); lower time_hours or choose a partition whose MaxTime allows it"
            )
    if nodes is not None:
        request = Request(nodes=job.nodes or 1, gpus_per_node=job.gpus_per_node, mem_mb=job.mem_mb)
        refuse_misfit(request, [partitions[p] for p in name.split(",")], nodes, conn_id)


def check_inputs(hook: SlurmHook, job: PreparedJob, log: logging.Logger) -> None:
    if not job.required_paths:
        return
    exists = cluster_read(log, "checking inputs", hook.paths_exist, list(job.required_paths))
    missing = [p for p, ok in exists.items() if not ok]
    if missing:
        raise NpaValidationError(
            f"required inputs do not exist on the cluster (checked with test -e): {', '.join(missing)}. Stage "
            "the data on shared storage (e.g. Lustre) first, or correct the paths; nothing was written or "
            "submitted."
        )
