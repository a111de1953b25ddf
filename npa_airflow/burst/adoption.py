"""Exactly one launch per task-instance try: adopt what this try or an earlier one left, or cancel it, and
launch only when nothing live is left (the Slurm side's contract, `slurm/operators/submission.py`).

The launch request is not idempotent and the cluster of a try carries the try's name, so a worker killed after
the launch request (or while it waited with ``deferrable=False``) left a launch that the next try would not
know. Before launching, a try reads what every earlier try left (``burst.tries``), then: adopts the newest live
launch or job ("reattach", the default; older live ones are cancelled as duplicates) or cancels them all
("cancel"), takes down clusters of earlier tries whose job ended, and launches. A launch request that failed in
transit may have reached the server: it is looked up by its name before the try fails. ``LaunchOrAdopt`` does it,
made by ``BurstLaunchOperatorBase`` for each try.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.task import TEARDOWN_POLICIES, dag_yaml
from npa_airflow.burst.tries import observe_tries, plan, upgraded_from
from npa_airflow.common.background_loop import run_sync
from npa_airflow.exceptions import NpaConnectionError, NpaError, NpaValidationError

if TYPE_CHECKING:
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.burst.tries import TryLaunch, TryRef
    from npa_airflow.common.deployment import Deployment


def teardown_policy(teardown: str | None, created: bool) -> str:
    """What becomes of a cluster once its job ended: `teardown` as given, else "down" for a cluster the task
    created and "keep" for one that already existed."""
    if teardown is None:
        return "down" if created else "keep"
    if teardown not in TEARDOWN_POLICIES:
        raise NpaValidationError(f"teardown={teardown!r}: use one of {TEARDOWN_POLICIES} (or None)")
    return teardown


@dataclass(eq=False, repr=False)
class LaunchOrAdopt:
    """The launch one try waits for, adopted or new (`run`).

    :param hook: the try's SkyPilot hook, open for the whole call.
    :param refs: every try of the task instance up to this one, oldest first (`tries.try_refs`).
    :param legacy: the earlier tries under the naming before the deployment key (`tries.legacy_try_refs`).
    :param task: the SkyPilot task dict to launch.
    :param log: the task's logger.
    :param conn_id: the connection the handle names.
    :param deployment: this deployment (a legacy name's launch counts only from before its identity existed).
    :param on_previous_try: "reattach" or "cancel" (`common.previous_try`).
    :param retry_until_up: SkyPilot's own retry of a launch until resources are found.
    :param teardown: the operator's teardown policy (None: by whether the cluster was created).
    """

    hook: SkyPilotHook
    refs: Sequence[TryRef]
    legacy: Sequence[TryRef]
    task: dict[str, Any]
    log: logging.Logger
    _: KW_ONLY
    conn_id: str
    deployment: Deployment
    on_previous_try: str
    retry_until_up: bool
    teardown: str | None

    def __post_init__(self) -> None:
        self.refs, self.legacy = list(self.refs), list(self.legacy)

    def run(self, nodes: int) -> BurstJobHandle:
        """Cancel or take down what earlier tries left, as `plan` says; then adopt, or launch on `nodes` nodes."""
        hook, own = self.hook, self.refs[-1]
        seen = upgraded_from(run_sync(observe_tries(hook, [*self.refs, *self.legacy])), self.deployment)
        steps = plan(seen, own.try_number, self.on_previous_try)
        for found in steps.cancel:
            self.log.info(
                "Cancelling the launch/job of try %d on cluster %s (%s)",
                *(found.ref.try_number, found.ref.cluster, self._why_cancel(steps.adopt)),
            )
            hook.cancel_and_teardown(self._handle_of(found), self.log, cancel=True, teardown=True)
        for found in steps.take_down:
            if teardown_policy(self.teardown, True) == "down":
                self.log.info(
                    "Taking down cluster %s of try %d: its job ended", found.ref.cluster, found.ref.try_number
                )
                hook.teardown(found.ref.cluster, self.log)
        if steps.adopt is not None:
            return self._adopt(steps.adopt)
        return self._launch(nodes)

    def _why_cancel(self, adopted: TryLaunch | None) -> str:
        if adopted is None:
            return "on_previous_try='cancel'"
        return f"a duplicate: the live launch of try {adopted.ref.try_number} is adopted"

    def _adopt(self, found: TryLaunch) -> BurstJobHandle:
        handle = self._handle_of(found)
        whose = (
            "this try's own" if found.ref.try_number == self.refs[-1].try_number else f"try {found.ref.try_number}'s"
        )
        state = found.job_state or (found.request.status if found.request else "unknown")
        self.log.info(
            "Adopting %s launch on cluster %s instead of launching again (launch request %s, job %s, %s)",
            *(whose, handle.cluster, handle.request_id, handle.job_id, state),
        )
        return handle

    def _handle_of(self, found: TryLaunch) -> BurstJobHandle:
        """The handle of what a try left: its own cluster was brought up by this task, a pinned one may not be."""
        created = not found.ref.pinned
        return BurstJobHandle(
            conn_id=self.conn_id,
            endpoint=self.hook.config.endpoint,
            cluster=found.ref.cluster,
            name=str(self.task["name"]),
            request_id=found.request.request_id if found.request else None,
            job_id=found.job_id,
            created_cluster=created,
            teardown=teardown_policy(self.teardown, created),
            submitted_at=found.submitted_at or time.time(),
            try_name=found.ref.try_name,
        )

    def _launch(self, nodes: int) -> BurstJobHandle:
        hook, own = self.hook, self.refs[-1]
        try:
            launch = hook.launch(dag_yaml(self.task, own.try_name), own.cluster, retry_until_up=self.retry_until_up)
        except NpaConnectionError as exc:
            # The request may have reached the server before the connection broke: look for it by its name.
            self.log.warning("The launch request may not have reached the API server (%s); looking it up", exc)
            try:
                (found,) = run_sync(observe_tries(hook, [own]))
            except NpaError:
                raise exc from None
            if found.found:
                return self._adopt(found)
            raise
        self.log.info(
            "SkyPilot API server %s (API %s) at %s", launch.server.version, launch.server.api_version, launch.endpoint
        )
        handle = BurstJobHandle(
            conn_id=self.conn_id,
            endpoint=launch.endpoint,
            cluster=own.cluster,
            name=str(self.task["name"]),
            request_id=launch.request_id,
            created_cluster=launch.created_cluster,
            teardown=teardown_policy(self.teardown, launch.created_cluster),
            submitted_at=time.time(),
            try_name=own.try_name,
        )
        self.log.info(
            "Launching %s on %s cluster %s (%d node(s)); launch request %s; teardown=%s",
            *(handle.name, "new" if launch.created_cluster else "existing", own.cluster, nodes),
            *(launch.request_id, handle.teardown),
        )
        return handle
