"""Which job a task instance's handle may make the API server act on: only what it derives itself.

The API server holds the deployment's connections. The listener (npa_airflow.plugin) cancels the job of a task
instance a user ended, and the Compute page reads its state, from the handle the task left in XCom. XCom is
writable by any running task (Airflow's execution API) and by REST users with XCom write, so a handle is a pointer,
never an authority: it is used only when it is this task instance's own, checked against what the API server derives
from the task instance, this deployment and the serialized task (the DAG file's values):
- the connection is the one the serialized task names;
- the job's name is the name this deployment gives one of the task instance's tries (a probe's knob-set suffix
  or a long run's segment suffix allowed; the previous release's names too, for jobs from before the upgrade);
- a Slurm cluster (-M) is the connection's; Burst's cluster is the try's own or the task's pinned one;
- a path is kept only when the layout derives it from the results root and the job's name (else dropped: the cancel
  then writes no marker or shreds no sidecar there).
The job id itself is checked on the cluster at the cancel: only the connection user's job of that name is cancelled
(npa_airflow.slurm.transport.cancels). Everything here is pure but `task_settings` (the serialized DAG).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.tries import legacy_try_refs, try_refs
from npa_airflow.common.naming import job_name_for, legacy_job_name_for
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.submit import layout

if TYPE_CHECKING:
    from npa_airflow.burst.tries import TryRef
    from npa_airflow.common.deployment import Deployment
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

# The NCCL probe's per-knob-set job names, a long run's later segments: ``...-k<index>-t<try>``, ``...-s<k>-t<try>``
_STEP_SUFFIX = re.compile(r"-[ks][0-9]{1,4}(?=-t[0-9]+$)")


@dataclass(frozen=True)
class TaskInstanceRef:
    dag_id: str
    task_id: str
    run_id: str
    map_index: int | None
    try_number: int  # the newest try: its handle may come from it or an earlier one

    @property
    def identity(self) -> tuple[str, str, str, int | None, int]:
        return self.dag_id, self.task_id, self.run_id, self.map_index, max(1, int(self.try_number or 1))


@dataclass(frozen=True)
class TaskSettings:
    """What the serialized task says: the DAG file's values, which no task can change."""

    conn_id: str | None
    results_root: str | None = None  # an absolute path written in the DAG file (a templated one is not known here)
    cluster_name: str | None = None  # Burst: the pinned cluster
    teardown: str | None = None  # Burst: the teardown policy the author set (None: the default)


@dataclass(frozen=True)
class Distrust:
    """A handle the API server does not act on, and why."""

    reason: str


def trusted_slurm_handle(
    raw: Any, ti: TaskInstanceRef, settings: TaskSettings, deployment: Deployment, config: SlurmConnectionConfig
) -> SlurmJobHandle | Distrust:
    """The task instance's Slurm job handle with only derived paths kept, or why it is not the task's own."""
    try:
        handle = SlurmJobHandle.from_dict(raw)
    except NpaValidationError as exc:
        return Distrust(f"malformed Slurm job handle: {exc}")
    if settings.conn_id is None or handle.conn_id != settings.conn_id:
        return Distrust(f"its connection {handle.conn_id!r} is not the task's ({settings.conn_id!r})")
    if _STEP_SUFFIX.sub("", handle.job_name) not in slurm_job_names(ti, deployment):
        return Distrust(f"job name {handle.job_name!r} is not the name of any try of this task instance")
    if handle.cluster not in (None, config.cluster_name):
        return Distrust(f"cluster {handle.cluster!r} is not the connection's ({config.cluster_name!r})")
    roots = [r.rstrip("/") for r in (settings.results_root, config.results_root) if _literal_root(r)]
    name = handle.job_name

    scripts = {p for r in roots for p in (layout.script_path(r, name), layout.probe_script_path(r, name))}
    sidecars = {layout.sidecar_path(r, name) for r in roots}
    return replace(
        handle,
        script_path=handle.script_path if handle.script_path in scripts else None,
        env_file=handle.env_file if handle.env_file in sidecars else None,
    )


def dropped_paths(raw: Any, trusted: SlurmJobHandle) -> list[str]:
    """The paths of the raw handle that the layout does not derive (for the log)."""
    raw = raw if isinstance(raw, dict) else {}
    return [f"{key}={raw.get(key)!r}" for key in ("script_path", "env_file") if raw.get(key) != getattr(trusted, key)]


def slurm_job_names(ti: TaskInstanceRef, deployment: Deployment) -> set[str]:
    """The names of every try of the task instance, this deployment's and the previous release's."""
    *key, tries = ti.identity
    return {
        name
        for t in range(1, tries + 1)
        for name in (job_name_for(*key, t, deployment=deployment), legacy_job_name_for(*key, t))
    }


def trusted_burst_try(
    raw: Any, ti: TaskInstanceRef, settings: TaskSettings, deployment: Deployment
) -> TryRef | Distrust:
    """The try of this task instance whose launch the handle points at, or why it is not the task's own."""
    try:
        handle = BurstJobHandle.from_dict(raw)
        refs = try_refs(ti.identity, deployment, settings.cluster_name)
    except NpaValidationError as exc:
        return Distrust(f"malformed Burst job handle: {exc}")
    if settings.conn_id is None or handle.conn_id != settings.conn_id:
        return Distrust(f"its connection {handle.conn_id!r} is not the task's ({settings.conn_id!r})")
    every = [*refs, *legacy_try_refs(ti.identity[:4], len(refs), settings.cluster_name)]
    for ref in every:
        if ref.cluster == handle.cluster and handle.try_name in (None, ref.try_name):
            return ref
    return Distrust(f"cluster {handle.cluster!r} (try {handle.try_name!r}) is not one of this task instance's tries")


def _literal_root(root: str | None) -> bool:
    return bool(root) and root.startswith("/") and "{{" not in root and "{%" not in root  # type: ignore[union-attr]


# -- the serialized task (I/O) ---------------------------------------------------------------------------------

_bag: Any = None


def task_settings(dag_version_id: Any, task_id: str, conn_attr: str) -> TaskSettings | None:
    """The serialized task's connection (`conn_attr`), results root, pinned cluster and teardown, from the DAG
    version that ran the task instance; None when it cannot be read."""
    global _bag
    # Airflow internals (ORM): only the API server reads the serialized DAG
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session

    if dag_version_id is None:
        return None
    if _bag is None:
        _bag = DBDagBag(load_op_links=False)
    with create_session() as session:
        dag = _bag.get_dag(dag_version_id, session)
    task = dag.task_dict.get(task_id) if dag is not None else None
    return settings_of(task, conn_attr) if task is not None else None


def settings_of(task: Any, conn_attr: str) -> TaskSettings:
    """The settings of the serialized `task` (pure): its own value, else the one given to `.partial()` (a mapped
    task), else the operator class's default (a mapped task keeps only what `.partial()` was given)."""
    partial = getattr(task, "partial_kwargs", None) or {}

    def value(name: str) -> Any:
        found = getattr(task, name, None)
        found = partial.get(name) if found is None else found
        return _class_default(task, name) if found is None else found

    def text(name: str) -> str | None:
        found = value(name)
        return found if isinstance(found, str) and found else None

    return TaskSettings(text(conn_attr), text("results_root"), text("cluster_name"), text("teardown"))


def _class_default(task: Any, name: str) -> Any:
    """The default of the argument `name` of the operator class `task` was made from (None when unknown)."""
    # the serializer's reader: only where a serialized task is read
    from npa_airflow.common.serialized_tasks import NotRebuildable, own_parameters, task_class

    try:
        default = own_parameters(task_class(task)).get(name)
    except (NotRebuildable, ImportError):
        return None
    return None if default is inspect.Parameter.empty else default
