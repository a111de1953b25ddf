"""The Compute page's I/O: live task instances and their job handles from the metadata database, and one
state query per Slurm cluster and per SkyPilot cluster, through the shared cache (:mod:`.cache`).

Every viewer's refresh asks the cache for ALL live jobs of a cluster (not only the ones that viewer may see),
so viewers share one answer; the app filters rows by the viewer's permissions afterwards.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from airflow.configuration import AIRFLOW_HOME, conf
from airflow.models.renderedtifields import RenderedTaskInstanceFields as Rtif
from airflow.models.taskinstance import TaskInstance as TI
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
from sqlalchemy import and_, select

from npa_airflow.burst import client as sky
from npa_airflow.burst.hook import SkyPilotHook
from npa_airflow.common import xcom_keys
from npa_airflow.common.deployment import current_deployment
from npa_airflow.common.links import DEFAULT_BURST_URL_TEMPLATE, _extra_value, format_burst_url, format_job_url
from npa_airflow.compute import rows as r
from npa_airflow.compute.cache import SharedCache
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.trusted_jobs import Distrust, TaskInstanceRef, task_settings, trusted_burst_try, trusted_slurm_handle

log = logging.getLogger(__name__)

CACHE_TTL_SECONDS = 10.0
HANDLE_KEYS = (xcom_keys.SLURM_JOB, xcom_keys.BURST_JOB)
REPORTED_KEYS = (xcom_keys.USAGE,)  # read in the same query, kept as they are (never trusted)


def cache_dir() -> str:
    """``[npa_airflow] compute_cache_dir``, else ``$AIRFLOW_HOME/npa-compute-cache`` (one per host)."""
    return conf.get("npa_airflow", "compute_cache_dir", fallback="") or os.path.join(AIRFLOW_HOME, "npa-compute-cache")


def default_cache() -> SharedCache:
    ttl = conf.getfloat("npa_airflow", "compute_cache_seconds", fallback=CACHE_TTL_SECONDS)
    return SharedCache(cache_dir(), ttl)


def live_tasks() -> list[r.LiveTask]:
    """Task instances in a live state whose XCom holds a Slurm or Burst job handle, with their rendered fields and
    the XComs of `REPORTED_KEYS` they pushed."""
    same_ti = and_(
        XComModel.dag_id == TI.dag_id,
        XComModel.run_id == TI.run_id,
        XComModel.task_id == TI.task_id,
        XComModel.map_index == TI.map_index,
    )
    rtif_of_ti = and_(
        Rtif.dag_id == TI.dag_id, Rtif.run_id == TI.run_id, Rtif.task_id == TI.task_id, Rtif.map_index == TI.map_index
    )
    columns = (TI.dag_id, TI.run_id, TI.task_id, TI.map_index, TI.try_number, TI.state, TI.dag_version_id)
    query = (
        select(*columns, XComModel.key, XComModel.value, Rtif.rendered_fields)
        .join(XComModel, same_ti)
        .outerjoin(Rtif, rtif_of_ti)
        .where(TI.state.in_(r.LIVE_TI_STATES), XComModel.key.in_((*HANDLE_KEYS, *REPORTED_KEYS)))
    )
    found: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    with create_session() as session:
        for row in session.execute(query):
            entry = found.setdefault(
                (row.dag_id, row.run_id, row.task_id, row.map_index),
                {"try_number": row.try_number, "state": str(getattr(row.state, "value", row.state)),
                 "handles": {}, "rendered": row.rendered_fields or {}, "version": row.dag_version_id,
                 "reported": {}},
            )  # fmt: skip
            value = _value(row)
            if row.key in REPORTED_KEYS:
                entry["reported"][row.key] = value
            elif isinstance(value, dict):
                entry["handles"][row.key] = value
    return [
        r.LiveTask(
            dag, run, task, index, e["try_number"], e["state"], e["handles"], e["rendered"], e["version"], e["reported"]
        )
        for (dag, run, task, index), e in found.items()
        if e["handles"]
    ]


UNREADABLE = "<an XCom value that cannot be decoded>"


def _value(row: Any) -> Any:
    """The XCom's value; one that does not decode is kept as UNREADABLE (a handle then is none, a report malformed)."""
    try:
        return XComModel.deserialize_value(row)
    except Exception:
        return UNREADABLE


def _slurm_fetch(conn_id: str, cluster: str | None):
    def fetch(job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        hook = SlurmHook(slurm_conn_id=conn_id).on_cluster(cluster)
        # One round trip: the sacct, and one squeue for every shown job (a pending job's reason is slurmctld's).
        states = hook.query_jobs(list(job_ids), pending=list(job_ids)).states
        return {
            job_id: asdict(r.JobStatus(info.state.value, info.native_state, info.reason, info.node_list, _usage(info)))
            for job_id, info in states.items()
        }

    return fetch


def _usage(info: SlurmJobInfo) -> dict[str, Any] | None:
    return info.usage.to_dict() if info.usage is not None else None


def _burst_fetch(conn_id: str, cluster: str):
    def fetch(job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        ids = [int(i) for i in job_ids]
        with SkyPilotHook(conn_id).get_client() as client:  # one /job_status call for every job of the cluster
            answer = client.call(sky.build_job_status(client.identity, cluster, ids), timeout=60)
        out = {}
        for job_id in job_ids:
            native = sky.parse_job_status(answer, int(job_id))
            state = sky.interpret_job_state(native).value
            out[job_id] = asdict(r.burst_status(native, state))
        return out

    return fetch


@dataclass(frozen=True)
class Snapshot:
    rows: list[r.ComputeRow]
    errors: dict[str, str]  # cluster label -> why its state is unknown
    fetched_at: dict[str, float]  # cluster label -> when its state was read


def _statuses(answer_value: Any) -> dict[str, r.JobStatus]:
    return {k: r.JobStatus(**v) for k, v in (answer_value or {}).items()}


def snapshot(cache: SharedCache | None = None, now: float | None = None) -> Snapshot:
    """Every live job of this provider, its state as the clusters answered (cached), as rows.

    A handle that is not its task instance's own job (npa_airflow.trusted_jobs) gets a row saying so and is asked
    about nowhere: one task's bad handle neither breaks the page nor another row's state."""
    cache = cache or default_cache()
    now = time.time() if now is None else now
    live, untrusted, configs = _checked(live_tasks())
    defaults = {conn_id: getattr(config, "cluster_name", None) for conn_id, config in configs.items()}
    errors: dict[str, str] = {}
    fetched: dict[str, float] = {}
    slurm_states: dict[tuple[str, str | None], dict[str, r.JobStatus]] = {}
    for (conn_id, cluster), ids in r.slurm_queries(live).items():
        label = r.slurm_cluster_label({"conn_id": conn_id, "cluster": cluster}, defaults)
        answer = cache.get(f"slurm|{conn_id}|{cluster or ''}", sorted(ids), _slurm_fetch(conn_id, cluster))
        slurm_states[(conn_id, cluster)] = _statuses(answer.value)
        fetched[label] = answer.fetched_at
        if answer.error:
            errors[label] = answer.error
    burst_states: dict[tuple[str, str], dict[str, r.JobStatus]] = {}
    for (conn_id, cluster), ids in r.burst_queries(live).items():
        keys = sorted(str(i) for i in ids)
        answer = cache.get(f"burst|{conn_id}|{cluster}", keys, _burst_fetch(conn_id, cluster))
        burst_states[(conn_id, cluster)] = _statuses(answer.value)
        fetched[cluster] = answer.fetched_at
        if answer.error:
            errors[cluster] = answer.error
    built = [*untrusted]
    for task in live:
        built.extend(_rows_of(task, slurm_states, burst_states, configs, now))
    return Snapshot(r.sort_rows(built), errors, fetched)


_KINDS = {xcom_keys.SLURM_JOB: (r.SLURM, "slurm_conn_id"), xcom_keys.BURST_JOB: (r.BURST, "skypilot_conn_id")}


def _checked(tasks: list[r.LiveTask]) -> tuple[list[r.LiveTask], list[r.ComputeRow], dict[str, Any]]:
    """The tasks with only their own jobs' handles (as the API server derives them), a row for each handle that is
    not (it is shown as such and asked about nowhere), and the Slurm connections' configs."""
    verdicts = _Verdicts()
    live, untrusted = [], []
    now = time.time()
    for task in tasks:
        ti = TaskInstanceRef(task.dag_id, task.task_id, task.run_id, task.map_index, task.try_number)
        own: dict[str, Any] = {}
        for key, raw in task.handles.items():
            kind, conn_attr = _KINDS[key]
            verdict = verdicts.of(task, ti, key, raw, conn_attr)
            if isinstance(verdict, Distrust):
                log.warning("Compute view: %s.%s %s: %s", task.dag_id, task.task_id, task.run_id, verdict.reason)
                untrusted.append(r.untrusted_row(task, kind, verdict.reason, now))
            elif key == xcom_keys.SLURM_JOB:
                own[key] = verdict.to_dict()
            else:
                own[key] = {**raw, "cluster": verdict.cluster}
        if own:
            live.append(replace(task, handles=own))
    return live, untrusted, verdicts.configs


class _Verdicts:
    """Whether a handle is its task instance's own job (npa_airflow.trusted_jobs), reading each serialized task's
    settings and each Slurm connection's config once per snapshot."""

    def __init__(self) -> None:
        self.settings_of: dict[tuple[Any, str, str], Any] = {}
        self.configs: dict[str, Any] = {}  # Slurm connection id -> its config (None: it cannot be read)

    def of(self, task: r.LiveTask, ti: TaskInstanceRef, key: str, raw: Any, conn_attr: str) -> Any:
        """The trusted handle (Slurm) or try (Burst), or a ``Distrust`` saying why not; never raises."""
        try:
            where = (task.dag_version_id, task.task_id, conn_attr)
            if where not in self.settings_of:
                self.settings_of[where] = task_settings(*where)
            settings = self.settings_of[where]
            if settings is None:
                return Distrust("the task's serialized DAG cannot be read")
            if key != xcom_keys.SLURM_JOB:
                return trusted_burst_try(raw, ti, settings, current_deployment())
            if settings.conn_id and settings.conn_id not in self.configs:
                self.configs.update(_slurm_configs({settings.conn_id}))
            config = self.configs.get(settings.conn_id) if settings.conn_id else None
            if config is None:
                return Distrust(f"connection {settings.conn_id!r} cannot be read")
            return trusted_slurm_handle(raw, ti, settings, current_deployment(), config)
        except Exception as exc:
            return Distrust(f"{type(exc).__name__}: {exc}")


def _rows_of(task, slurm_states, burst_states, configs, now) -> list[r.ComputeRow]:
    out = []
    defaults = {conn_id: getattr(config, "cluster_name", None) for conn_id, config in configs.items()}
    slurm = task.handles.get(xcom_keys.SLURM_JOB)
    if slurm:
        status = slurm_states.get((slurm["conn_id"], slurm.get("cluster")), {}).get(str(slurm["job_id"]))
        job_url = _slurm_job_url(slurm, configs.get(slurm["conn_id"]))
        out.append(r.slurm_row(task, status, defaults, now, job_url=job_url))
    burst = task.handles.get(xcom_keys.BURST_JOB)
    if burst:
        states = burst_states.get((burst["conn_id"], burst["cluster"]), {})
        status = states.get(str(burst.get("job_id"))) if burst.get("job_id") is not None else None
        reporter = replace(task, reported={}) if slurm else task  # the task's one report counts once (Slurm's row)
        out.append(r.burst_row(reporter, status, now, job_url=_burst_job_url(burst)))
    return out


def _slurm_configs(conn_ids: set[str]) -> dict[str, Any]:
    """Each Slurm connection's config (None when it cannot be read)."""
    configs: dict[str, Any] = {}
    for conn_id in conn_ids:
        try:
            configs[conn_id] = SlurmHook(slurm_conn_id=conn_id).config
        except Exception as exc:
            log.warning("Compute view: cannot read Slurm connection %s: %s", conn_id, exc)
            configs[conn_id] = None
    return configs


def _slurm_job_url(handle: dict[str, Any], config: Any) -> str | None:
    template = getattr(config, "job_url_template", None)
    try:
        return format_job_url(template, handle) if template else None
    except (KeyError, IndexError, ValueError):
        return None


def _burst_job_url(handle: dict[str, Any]) -> str | None:
    template = _extra_value(handle.get("conn_id"), "dashboard_url_template") or DEFAULT_BURST_URL_TEMPLATE
    try:
        return format_burst_url(template, handle)
    except (KeyError, IndexError, ValueError):
        return None
