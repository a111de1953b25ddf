"""What the tries of one task instance left on the SkyPilot API server, found by their deterministic names.

Each try launches under its own name ``npa-<slug>-<hash>-t<try>`` (``common.naming``): it is the launch's DAG
name and, unless the author pinned ``cluster_name``, its cluster's name. Before launching, a try reads what the
earlier tries (and itself, when its worker was restarted) left: one ``/status`` call for the clusters named
after them, the launch requests the server holds for those clusters (a launch still in flight has no cluster
yet), the job a finished launch created, and, for a cluster whose launch request the server has already
dropped (finished requests are kept 24 h), the newest job on it. ``plan`` then says what to adopt, cancel and
take down, so that a retry never launches beside a live launch of an earlier try.

A pinned cluster is shared by every try (and may hold jobs of other tasks): there a try's job is known only from
its launch request, found by its DAG name, and the cluster itself is never counted as left over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from npa_airflow.burst import client as sky
from npa_airflow.burst.task import validate_cluster_name
from npa_airflow.common import previous_try
from npa_airflow.common.naming import earlier_try_names, job_name_for, legacy_job_name_for
from npa_airflow.common.remote_errors import skypilot_cluster_gone

if TYPE_CHECKING:
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.common.deployment import Deployment

# (dag_id, task_id, run_id, map_index) of a task instance.
TaskInstanceKey = tuple[str, str, str, "int | None"]


@dataclass(frozen=True)
class TryRef:
    """One try: its number, its name, and the cluster it launches on."""

    try_number: int
    try_name: str
    cluster: str
    legacy: bool = False  # named as releases before the deployment key named it (`common.naming`)

    @property
    def pinned(self) -> bool:
        return self.cluster != self.try_name


def try_refs(
    identity: tuple[str, str, str, int | None, int], deployment: Deployment, pinned: str | None
) -> list[TryRef]:
    """Tries 1 .. the current one of the task instance ``identity`` (dag, task, run, map index, try), oldest first:
    the name this deployment gives each, and its cluster (the pinned ``cluster_name``, else the name)."""
    names = [*earlier_try_names(*identity, deployment=deployment), job_name_for(*identity, deployment=deployment)]
    cluster = validate_cluster_name(pinned) if pinned else None
    return [
        TryRef(number, name.lower(), cluster or validate_cluster_name(name.lower()))
        for number, name in enumerate(names, start=1)
    ]


def legacy_try_refs(key: TaskInstanceKey, tries: int, pinned: str | None) -> list[TryRef]:
    """Tries 1 .. ``tries`` under the naming before the deployment key (found once after the upgrade)."""
    names = [legacy_job_name_for(*key, t) for t in range(1, tries + 1)]
    cluster = validate_cluster_name(pinned) if pinned else None
    return [
        TryRef(number, name.lower(), cluster or validate_cluster_name(name.lower()), legacy=True)
        for number, name in enumerate(names, start=1)
    ]


def upgraded_from(found: Sequence[TryLaunch], deployment: Deployment) -> list[TryLaunch]:
    """``found`` without what its legacy refs found unless launched before this deployment's identity existed
    (before the upgrade): a later launch under an old name is another deployment's, still on the old release."""
    created = deployment.created_at

    def before_upgrade(t: TryLaunch) -> bool:
        return created is not None and t.submitted_at is not None and t.submitted_at < created

    return [t for t in found if not t.ref.legacy or (t.found and before_upgrade(t))]


@dataclass(frozen=True)
class TryLaunch:
    """What one try left: its newest launch request, its cluster, and the job the launch created."""

    ref: TryRef
    request: sky.RequestResult | None = None
    cluster_status: str | None = None  # None: no cluster of that name
    cluster_launched_at: float | None = None
    job_id: int | None = None
    job_state: str | None = None  # SkyPilot's native state; None: no such job (or it went with its cluster)
    state_unread: bool = False  # the job's state could not be read: it counts as live

    @property
    def found(self) -> bool:
        return self.request is not None or self.job_id is not None

    @property
    def live(self) -> bool:
        """The launch is in flight or its job has not ended (adopting or cancelling it is the only safe move)."""
        if self.request is not None and not self.request.finished:
            return True
        if self.job_id is None:
            return False
        if self.state_unread:
            return True
        return self.job_state is not None and not sky.interpret_job_state(self.job_state).is_terminal

    @property
    def left_over(self) -> bool:
        """Its own cluster is still there although nothing runs on it any more."""
        return not self.ref.pinned and self.cluster_status is not None and not self.live

    @property
    def submitted_at(self) -> float | None:
        return (self.request.created_at if self.request else None) or self.cluster_launched_at


@dataclass(frozen=True)
class Plan:
    """``adopt`` (wait for it instead of launching), ``cancel`` (live, cancel and apply the teardown policy),
    ``take_down`` (ended, take its cluster down)."""

    adopt: TryLaunch | None
    cancel: tuple[TryLaunch, ...] = ()
    take_down: tuple[TryLaunch, ...] = ()


def plan(found: Sequence[TryLaunch], own_try: int, on_previous_try: str) -> Plan:
    """Adopt this try's own launch if it made one; else `common.previous_try`'s rule over the earlier tries' live
    launches: the newest adopted ("reattach", older live ones are duplicates and cancelled) or all cancelled
    ("cancel"). Ended tries' clusters go."""
    mine = next((t for t in found if t.ref.try_number == own_try and t.found), None)
    earlier = sorted((t for t in found if t.ref.try_number < own_try), key=lambda t: t.ref.try_number)
    live = [t for t in earlier if t.live]
    take_down = tuple(t for t in earlier if t.left_over)
    if mine is not None:
        return Plan(mine, (), take_down)
    rule = previous_try.on_previous_try(on_previous_try, live)
    return Plan(rule.adopt, rule.cancel, take_down)


def launch_of(ref: TryRef, launches: Sequence[sky.RequestResult]) -> sky.RequestResult | None:
    """The newest launch request of ``ref``: named after the try (its DAG name), or, on the try's own cluster,
    one whose body the listing did not show."""
    mine = [r for r in launches if r.dag_name == ref.try_name or (r.dag_name is None and not ref.pinned)]
    return max(mine, key=lambda r: r.created_at or 0.0, default=None)


async def observe_tries(hook: SkyPilotHook, refs: Sequence[TryRef]) -> list[TryLaunch]:
    """What each try of ``refs`` left (see the module docstring); an unanswered call raises."""
    names = list(dict.fromkeys(ref.cluster for ref in refs))
    clusters = await hook.aclusters(names)
    launches = dict(zip(names, await asyncio.gather(*(hook.alaunches(name) for name in names)), strict=True))
    return [await _observe(hook, ref, launch_of(ref, launches[ref.cluster]), clusters.get(ref.cluster)) for ref in refs]


async def _observe(
    hook: SkyPilotHook, ref: TryRef, request: sky.RequestResult | None, cluster: dict | None
) -> TryLaunch:
    status = None if cluster is None else str(cluster.get("status") or "UNKNOWN")
    launched_at = cluster.get("launched_at") if cluster is not None else None
    seen = TryLaunch(ref, request, status, launched_at if isinstance(launched_at, (int, float)) else None)
    if request is not None and request.status == "SUCCEEDED":
        job_id = sky.parse_launch_result((await hook.alaunch_result(request.request_id)).return_value)
        return await _with_job_state(hook, seen, job_id)
    if request is None and status is not None and not ref.pinned:
        try:
            jobs = await hook.ajobs(ref.cluster)
        except sky.SkyPilotApiError as exc:
            if skypilot_cluster_gone(exc.error_type):  # not up (e.g. a launch that never finished): no job
                return seen
            raise
        if jobs:
            newest = max(jobs)
            return replace(seen, job_id=newest, job_state=jobs[newest])
    return seen


async def _with_job_state(hook: SkyPilotHook, seen: TryLaunch, job_id: int | None) -> TryLaunch:
    if job_id is None:
        return seen
    try:
        return replace(seen, job_id=job_id, job_state=await hook.ajob_status(seen.ref.cluster, job_id))
    except sky.SkyPilotApiError as exc:  # a cluster that is gone took the job with it
        return replace(seen, job_id=job_id, state_unread=not skypilot_cluster_gone(exc.error_type))
