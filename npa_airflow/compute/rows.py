"""The Compute page's rows, totals and filters: pure functions of what the database and the clusters answered.

A row is one job (Slurm or Burst) of one live task instance. The I/O that gathers the inputs lives in
:mod:`npa_airflow.compute.sources`; the HTTP side in :mod:`npa_airflow.compute.app`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote

from npa_airflow.common import xcom_keys
from npa_airflow.common.naming import segment_of
from npa_airflow.compute import usage as u
from npa_airflow.slurm.watch.failures import expand_hostlist

# Task instance states whose job may still be queued or running on a cluster (a try going up for retry may
# leave its job running: the next try reattaches to it).
LIVE_TI_STATES = ("queued", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting", "scheduled")
SLURM = "slurm"
BURST = "burst"


@dataclass(frozen=True)
class TaskTry:
    """A task instance's try, as the page names it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    ti_state: str


@dataclass(frozen=True)
class LiveTask(TaskTry):
    """A live task instance of this provider and the job handles its XCom holds (by XCom key)."""

    handles: Mapping[str, Mapping[str, Any]]
    rendered: Mapping[str, Any] = field(default_factory=dict)  # the try's rendered template fields
    dag_version_id: Any = None  # the serialized DAG that ran the try (what its handles are checked against)
    reported: Mapping[str, Any] = field(default_factory=dict)  # other XComs read, by key (npa_usage): never trusted


@dataclass(frozen=True)
class Resources:
    nodes: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None


@dataclass(frozen=True)
class JobStatus:
    """What one state query said about one job (Slurm: sacct/squeue; Burst: SkyPilot's job status)."""

    state: str  # the provider's vocabulary: PENDING, RUNNING, COMPLETE, ERROR, CANCELED, UNKNOWN
    native_state: str | None = None  # e.g. CONFIGURING, SUSPENDED, INIT
    reason: str | None = None  # Slurm's pending reason (Resources, Priority, JobHeldUser, ...)
    node_list: str | None = None
    usage: Mapping[str, Any] | None = None  # Slurm: sacct's `JobUsage.to_dict()`; None: unknown


@dataclass(frozen=True)
class ComputeRow(TaskTry):
    """One job of the page: its try (the fields of ``TaskTry`` come first), then the job."""

    kind: str  # "slurm" | "burst"
    cluster: str
    job: str  # Slurm job id, or "<skypilot cluster>/<job id>"
    state: str
    native_state: str | None
    reason: str | None
    nodes: int | None
    gpus: int | None
    partition: str | None
    submitted_at: float | None
    elapsed_s: int | None
    task_url: str
    log_url: str
    job_url: str | None
    error: str | None = None  # why the handle in the task's XCom is not shown as its job
    segment: int = 1  # of a run split into segments (the job name's -s<k>; none is segment 1)
    gpu_hours: float | None = None  # None: unknown (gpu_hours_unknown says why)
    gpu_hours_unknown: str | None = None
    gpu_hours_from: str | None = None  # usage.FROM_CLUSTER (the job so far) or usage.FROM_TASK (the whole try)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_DIRECTIVE = re.compile(r"^#SBATCH[ \t]+(--?[A-Za-z-]+)(?:[= \t]+(\S+))?", re.MULTILINE)
# What Airflow puts before a rendered field longer than [core] max_templated_field_length: the field's head
# follows, cut anywhere and "..." appended; a long script's #SBATCH lines are in that head.
AIRFLOW_TRUNCATED_PREFIX = "Truncated. You can change this behaviour in [core]max_templated_field_length. "


def parse_sbatch_resources(script: str | None) -> Resources:
    """Nodes, GPUs per node and partition from a script's ``#SBATCH`` lines (only the lines before the first
    command count, as for sbatch; a missing option is None), also from a rendered field Airflow truncated."""
    if not isinstance(script, str):
        return Resources()
    if script.startswith(AIRFLOW_TRUNCATED_PREFIX):
        script = script[len(AIRFLOW_TRUNCATED_PREFIX) :].rpartition("\n")[0]  # without the line the cut ran through
    head = []
    for line in script.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        head.append(stripped)
    options = {m.group(1): m.group(2) for m in _DIRECTIVE.finditer("\n".join(head))}
    nodes = _leading_int(options.get("--nodes") or options.get("-N"))
    gpus = _gres_gpus(options.get("--gres")) or _leading_int(options.get("--gpus-per-node"))
    partition = options.get("--partition") or options.get("-p")
    return Resources(nodes=nodes, gpus_per_node=gpus, partition=partition)


def _leading_int(value: str | None) -> int | None:
    match = re.match(r"([0-9]+)", value or "")
    return int(match.group(1)) if match else None


def _gres_gpus(gres: str | None) -> int | None:
    """``gpu:8`` / ``gpu:a100:4`` (first gpu entry of a comma list) -> GPUs per node."""
    for item in (gres or "").split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            return _leading_int(parts[-1]) if len(parts) > 1 else 1
    return None


def slurm_cluster_label(handle: Mapping[str, Any], default_clusters: Mapping[str, str | None]) -> str:
    """The handle's cluster, else its connection's ``cluster_name``, else the connection id itself."""
    conn_id = str(handle.get("conn_id") or "")
    return str(handle.get("cluster") or default_clusters.get(conn_id) or conn_id)


def slurm_queries(tasks: Iterable[LiveTask]) -> dict[tuple[str, str | None], list[str]]:
    """One query per (connection, cluster named by the handle): the job ids to ask it about, in order."""
    queries: dict[tuple[str, str | None], list[str]] = {}
    for task in tasks:
        handle = task.handles.get(xcom_keys.SLURM_JOB)
        if handle and handle.get("job_id"):
            ids = queries.setdefault((str(handle["conn_id"]), handle.get("cluster")), [])
            if str(handle["job_id"]) not in ids:
                ids.append(str(handle["job_id"]))
    return queries


def burst_queries(tasks: Iterable[LiveTask]) -> dict[tuple[str, str], list[int]]:
    """One status call per (connection, SkyPilot cluster): its job ids (launches without one are not asked)."""
    queries: dict[tuple[str, str], list[int]] = {}
    for task in tasks:
        handle = task.handles.get(xcom_keys.BURST_JOB)
        if handle and isinstance(handle.get("job_id"), int):
            ids = queries.setdefault((str(handle["conn_id"]), str(handle["cluster"])), [])
            if handle["job_id"] not in ids:
                ids.append(handle["job_id"])
    return queries


def ti_path(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """The task instance's page in the Airflow UI (relative to the UI's base URL)."""
    path = f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}"
    return f"{path}/mapped/{map_index}" if map_index >= 0 else path


def _elapsed(submitted_at: Any, now: float) -> int | None:
    if isinstance(submitted_at, (int, float)) and not isinstance(submitted_at, bool) and submitted_at <= now:
        return int(now - submitted_at)
    return None


def _common(task: LiveTask, handle: Mapping[str, Any], now: float) -> dict[str, Any]:
    page = ti_path(task.dag_id, task.run_id, task.task_id, task.map_index)
    submitted_at = handle.get("submitted_at")
    if not isinstance(submitted_at, (int, float)) or isinstance(submitted_at, bool):
        submitted_at = None
    return {
        "submitted_at": submitted_at,
        "elapsed_s": _elapsed(submitted_at, now),
        "dag_id": task.dag_id,
        "run_id": task.run_id,
        "task_id": task.task_id,
        "map_index": task.map_index,
        "try_number": task.try_number,
        "ti_state": task.ti_state,
        "task_url": f"{page}/details",
        "log_url": f"{page}?try_number={task.try_number}",
    }


def _status_fields(status: JobStatus | None) -> dict[str, Any]:
    """A row's state, native state and reason: UNKNOWN without an answer."""
    if status is None:
        return {"state": "UNKNOWN", "native_state": None, "reason": None}
    return {"state": status.state, "native_state": status.native_state, "reason": status.reason}


def slurm_row(
    task: LiveTask,
    status: JobStatus | None,
    default_clusters: Mapping[str, str | None],
    now: float,
    job_url: str | None = None,
) -> ComputeRow:
    """The row of a task's Slurm job; ``status`` None: the query did not answer (state UNKNOWN)."""
    handle = task.handles[xcom_keys.SLURM_JOB]
    asked = parse_sbatch_resources(task.rendered.get("sbatch_script"))
    partition = asked.partition or _str_or_none(task.rendered.get("partition"))
    allocated = expand_hostlist(status.node_list) if status and status.state == "RUNNING" else []
    nodes = len(allocated) or asked.nodes
    gpus = nodes * asked.gpus_per_node if nodes and asked.gpus_per_node is not None else None
    return ComputeRow(
        kind=SLURM,
        cluster=slurm_cluster_label(handle, default_clusters),
        job=str(handle.get("job_id")),
        **_status_fields(status),
        nodes=nodes,
        gpus=gpus,
        partition=partition,
        job_url=job_url,
        segment=(segment := segment_of(_str_or_none(handle.get("job_name")))),
        **u.row_gpu_hours(status, task.reported, u.NO_SLURM_RECORD, segment).fields(),
        **_common(task, handle, now),
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


# The seed's words for a Burst job that waits: it has not claimed capacity yet, only the intent to.
BURST_WAITING = "a pending burst job is still holding your intent, not your capacity"


def burst_status(native: str | None, state: str) -> JobStatus:
    """SkyPilot's native job state as a status; a waiting one carries the seed's reason."""
    return JobStatus(state, native, BURST_WAITING if state == "PENDING" else None)


def burst_row(task: LiveTask, status: JobStatus | None, now: float, job_url: str | None = None) -> ComputeRow:
    """The row of a task's Burst job: SkyPilot cluster / job id; a launch without a job id yet is PENDING."""
    handle = task.handles[xcom_keys.BURST_JOB]
    job_id = handle.get("job_id")
    if job_id is None and status is None:
        status = JobStatus("PENDING", "LAUNCHING", f"launching: {BURST_WAITING}")
    return ComputeRow(
        kind=BURST,
        cluster=str(handle.get("cluster")),
        job=f"{handle.get('cluster')}/{job_id if job_id is not None else '-'}",
        **_status_fields(status),
        nodes=None,
        gpus=None,
        partition=None,
        job_url=job_url,
        segment=segment_of(_str_or_none(handle.get("name"))),
        **u.row_gpu_hours(status, task.reported, u.NO_BURST_RECORD).fields(),
        **_common(task, handle, now),
    )


UNTRUSTED_CLUSTER = "-"


def untrusted_row(task: LiveTask, kind: str, why: str, now: float) -> ComputeRow:
    """The row of a task whose handle is not its own job (malformed, or naming what the task does not own): the
    page says so in that row, and no cluster is asked about it."""
    return ComputeRow(
        kind=kind,
        cluster=UNTRUSTED_CLUSTER,
        job="?",
        **_status_fields(None),
        nodes=None,
        gpus=None,
        partition=None,
        job_url=None,
        error=f"the job handle in this task's XCom is ignored: {why}",
        **u.GpuHours(None, u.IGNORED).fields(),
        **_common(task, {}, now),
    )


@dataclass
class ClusterTotals:
    cluster: str
    jobs: int = 0
    running: int = 0
    pending: int = 0
    gpus_held: int = 0
    gpus_pending: int = 0


def cluster_totals(rows: Iterable[ComputeRow]) -> list[dict[str, Any]]:
    """Per cluster: jobs, running, pending, and the GPUs running jobs hold and pending jobs wait for."""
    totals: dict[str, ClusterTotals] = {}
    for row in rows:
        entry = totals.setdefault(row.cluster, ClusterTotals(row.cluster))
        entry.jobs += 1
        if row.state == "RUNNING":
            entry.running += 1
            entry.gpus_held += row.gpus or 0
        elif row.state == "PENDING":
            entry.pending += 1
            entry.gpus_pending += row.gpus or 0
    return [asdict(totals[name]) for name in sorted(totals)]


def filter_rows(
    rows: Iterable[ComputeRow], *, cluster: str | None = None, state: str | None = None, dag_id: str | None = None
) -> list[ComputeRow]:
    """Rows matching every given filter (an empty or None filter matches all)."""
    return [
        row
        for row in rows
        if (not cluster or row.cluster == cluster)
        and (not state or row.state == state.upper())
        and (not dag_id or row.dag_id == dag_id)
    ]


def sort_rows(rows: Iterable[ComputeRow]) -> list[ComputeRow]:
    """Cluster, then running before pending before the rest, then the oldest job first."""
    order = {"RUNNING": 0, "PENDING": 1}
    return sorted(rows, key=lambda r: (r.cluster, order.get(r.state, 2), r.submitted_at or 0.0, r.job))
