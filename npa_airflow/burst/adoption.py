"""Exactly one launch per task-instance try: adopt what this try or an earlier one left, or cancel it, and
launch only when nothing live is left (the Slurm side's contract, `slurm/operators/submission.py`).

The launch request is not idempotent and the cluster of a try carries the try's name, so a worker killed after
the launch request (or while it waited with ``deferrable=False``) left a launch that the next try would not
know. Before launching, a try reads what every earlier try left (``burst.tries``), then: adopts the newest live
launch or job ("reattach", the default; older live ones are cancelled as duplicates) or cancels them all
("cancel"), takes down clusters of earlier tries whose job ended, and launches. A launch request that failed in
transit may have reached the server: it is looked up by its name before the try fails. Mixed into
``BurstLaunchOperatorBase``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npa_airflow.common import xcom_keys

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.burst.tries import TryLaunch, TryRef


class AdoptOrLaunchMixin:
    """The launch half of the Burst lifecycle (the operator supplies the attributes declared here)."""

    log: logging.Logger
    skypilot_conn_id: str
    cluster_name: str | None
    on_previous_try: str
    retry_until_up: bool
    _handle: BurstJobHandle | None
    _teardown_for: Callable[[bool], str]

    def try_refs(self, context: Context) -> list[TryRef]:
        """Every try of this task instance up to the current one (oldest first): its name and its cluster.

        The names are keyed by this deployment (`common.naming`), so another deployment's launch of the same DAG
        run is never one of them."""
        from npa_airflow.burst.tries import try_refs
        from npa_airflow.common.deployment import current_deployment

        ti = context["ti"]
        identity = (ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None), int(ti.try_number or 1))
        return try_refs(identity, current_deployment(), self.cluster_name)

    def adopt_or_launch(self, hook: SkyPilotHook, context: Context, task: dict[str, Any], nodes: int) -> BurstJobHandle:
        """The launch this try waits for (adopted or new), pushed to XCom before any wait so a kill can find it."""
        from npa_airflow.burst.tries import legacy_try_refs, observe_tries, plan, upgraded_from
        from npa_airflow.common.background_loop import run_sync
        from npa_airflow.common.deployment import current_deployment

        refs = self.try_refs(context)
        ti = context["ti"]
        key = (ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None))
        legacy = legacy_try_refs(key, len(refs) - 1, self.cluster_name)  # earlier tries only
        with hook:
            seen = upgraded_from(run_sync(observe_tries(hook, [*refs, *legacy])), current_deployment())
            steps = plan(seen, refs[-1].try_number, self.on_previous_try)
            for found in steps.cancel:
                self.log.info(
                    "Cancelling the launch/job of try %d on cluster %s (%s)",
                    *(found.ref.try_number, found.ref.cluster, self._why_cancel(steps.adopt)),
                )
                hook.cancel_and_teardown(self._handle_of(hook, found, task), self.log, cancel=True, teardown=True)
            for found in steps.take_down:
                if self._teardown_for(True) == "down":
                    self.log.info(
                        "Taking down cluster %s of try %d: its job ended", found.ref.cluster, found.ref.try_number
                    )
                    hook.teardown(found.ref.cluster, self.log)
            if steps.adopt is not None:
                handle = self._adopt(hook, steps.adopt, task, refs[-1].try_number)
            else:
                handle = self._launch(hook, task, nodes, refs[-1])
        self._handle = handle
        context["ti"].xcom_push(key=xcom_keys.BURST_JOB, value=handle.to_dict())
        return handle

    def _why_cancel(self, adopted: TryLaunch | None) -> str:
        if adopted is None:
            return "on_previous_try='cancel'"
        return f"a duplicate: the live launch of try {adopted.ref.try_number} is adopted"

    def _adopt(self, hook: SkyPilotHook, found: TryLaunch, task: dict[str, Any], own_try: int) -> BurstJobHandle:
        handle = self._handle_of(hook, found, task)
        whose = "this try's own" if found.ref.try_number == own_try else f"try {found.ref.try_number}'s"
        state = found.job_state or (found.request.status if found.request else "unknown")
        self.log.info(
            "Adopting %s launch on cluster %s instead of launching again (launch request %s, job %s, %s)",
            *(whose, handle.cluster, handle.request_id, handle.job_id, state),
        )
        return handle

    def _handle_of(self, hook: SkyPilotHook, found: TryLaunch, task: dict[str, Any]) -> BurstJobHandle:
        """The handle of what a try left: its own cluster was brought up by this task, a pinned one may not be."""
        from npa_airflow.burst.handle import BurstJobHandle

        created = not found.ref.pinned
        return BurstJobHandle(
            conn_id=self.skypilot_conn_id,
            endpoint=hook.config.endpoint,
            cluster=found.ref.cluster,
            name=str(task["name"]),
            request_id=found.request.request_id if found.request else None,
            job_id=found.job_id,
            created_cluster=created,
            teardown=self._teardown_for(created),
            submitted_at=found.submitted_at or time.time(),
            try_name=found.ref.try_name,
        )

    def _launch(self, hook: SkyPilotHook, task: dict[str, Any], nodes: int, own: TryRef) -> BurstJobHandle:
        from npa_airflow.burst.handle import BurstJobHandle
        from npa_airflow.burst.task import dag_yaml
        from npa_airflow.burst.tries import observe_tries
        from npa_airflow.common.background_loop import run_sync
        from npa_airflow.exceptions import NpaConnectionError, NpaError

        try:
            launch = hook.launch(dag_yaml(task, own.try_name), own.cluster, retry_until_up=self.retry_until_up)
        except NpaConnectionError as exc:
            # The request may have reached the server before the connection broke: look for it by its name.
            self.log.warning("The launch request may not have reached the API server (%s); looking it up", exc)
            try:
                (found,) = run_sync(observe_tries(hook, [own]))
            except NpaError:
                raise exc from None
            if found.found:
                return self._adopt(hook, found, task, own.try_number)
            raise
        self.log.info(
            "SkyPilot API server %s (API %s) at %s", launch.server.version, launch.server.api_version, launch.endpoint
        )
        handle = BurstJobHandle(
            conn_id=self.skypilot_conn_id,
            endpoint=launch.endpoint,
            cluster=own.cluster,
            name=str(task["name"]),
            request_id=launch.request_id,
            created_cluster=launch.created_cluster,
            teardown=self._teardown_for(launch.created_cluster),
            submitted_at=time.time(),
            try_name=own.try_name,
        )
        self.log.info(
            "Launching %s on %s cluster %s (%d node(s)); launch request %s; teardown=%s",
            *(handle.name, "new" if launch.created_cluster else "existing", own.cluster, nodes),
            *(launch.request_id, handle.teardown),
        )
        return handle
