"""The Slurm trigger's cancels: right away when the job can never finish in time (its deadline, a pending reason
that never clears: cancel, then fire), and when a user ended the deferred task (`on_kill`). Mixed into
`SlurmJobTrigger`.

Both go through the cluster's poller (`kills`, `npa_airflow.slurm.kill_batch`), so that the cancels of many
triggers of one cluster share one scancel; what is cancelled is `CancelRequest.for_handle` of the job's handle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from npa_airflow.common import xcom_keys
from npa_airflow.common.ownership import Claim, TaskView, Verdict, decide, read_task_view, shielded
from npa_airflow.common.retry import Backoff, Budget, aretry
from npa_airflow.exceptions import cluster_did_not_answer
from npa_airflow.slurm.cancels import CancelRequest
from npa_airflow.slurm.fit import NEVER_CLEARING_REASONS

if TYPE_CHECKING:
    from airflow.triggers.base import TriggerEvent

    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.poller import Registration, SlurmPoller

module_log = logging.getLogger(__name__)  # on_kill's lines reach the triggerer's own log
DEADLINE_CANCEL_TIMEOUT = 30.0
ON_KILL_TIMEOUT = 25.0  # the triggerer allows on_kill 30 s by default ([triggerer] on_kill_timeout)
CLAIM_READ_TIMEOUT = 10.0
CANCEL_BACKOFF = Backoff(base=1.0, cap=8.0, jitter=0.5)  # between scancel attempts, inside the timeouts above


class TriggerCancelMixin:
    """The cancel half of `SlurmJobTrigger` (the trigger supplies the attributes declared here)."""

    log: logging.Logger
    job_id: str
    cancel_on_kill: bool
    handle: SlurmJobHandle
    _fired: bool
    _registration: Registration | None
    _claim: Claim | None
    _claim_file: str | None
    _poller: Callable[[], SlurmPoller]
    _fire: Callable[..., TriggerEvent]

    async def _deadline_event(self, message: str) -> TriggerEvent:
        """The deadline passed: cancel here, then fire."""
        await self._cancel_here(message)
        return self._fire("deadline", message)

    async def _unsatisfiable_event(self, token: str, reason: str) -> TriggerEvent:
        """PENDING on a reason that never clears: cancel here and tell the operator why and what to change."""
        message = (
            f"Slurm job {self.job_id} can never start: it is PENDING with Reason={reason} "
            f"({NEVER_CLEARING_REASONS[token]})"
        )
        await self._cancel_here(message)
        return self._fire("unsatisfiable", message, reason=reason, native_state="PENDING", state="PENDING")

    async def _cancel(self, why: str) -> str:
        """scancel the job (recording that Airflow did), retrying while the cluster does not answer.

        Returns what happened ("cancelled" or "ended"); raises when it could not cancel. Callers bound the time.
        """
        kills = self._poller().kills  # batched with the other triggers' cancels (a whole DAG run marked failed)
        request = CancelRequest.for_handle(self.handle)

        def again(exc: BaseException, delay: float) -> None:
            self.log.warning("Cancelling Slurm job %s failed (%s); retrying in %.0f s", self.job_id, exc, delay)

        outcome: str = await aretry(
            lambda: kills.cancel(request),
            transient=cluster_did_not_answer,
            backoff=CANCEL_BACKOFF,
            budget=Budget(),
            on_retry=again,
        )
        if outcome == "ended":
            self.log.info("Slurm job %s had already ended: nothing to cancel (%s)", self.job_id, why)
        else:
            self.log.info("Cancelled Slurm job %s: %s", self.job_id, why)
        return outcome

    async def _cancel_here(self, why: str) -> None:
        """Cancel the job right here (the task may take a while to resume on a worker).

        Bounded: the operator cancels again when it resumes (and reports a cancel that failed), and scancel is
        idempotent.
        """
        try:
            await asyncio.wait_for(self._cancel(why), DEADLINE_CANCEL_TIMEOUT)
        except Exception as exc:
            self.log.warning("Could not cancel Slurm job %s (%s): %s; the task will try again", self.job_id, why, exc)

    # -- user kill ---------------------------------------------------------------------------------------

    async def on_kill(self) -> None:
        """Cancel the job when a user ended the deferred task (mark failed/success, clear, run failed).

        Airflow 3.3.2 also calls this when the trigger only moved to another triggerer, so the message is not
        trusted: `npa_airflow.common.ownership` decides from the task instance's state and the job's claim.
        Idempotent and bounded (ON_KILL_TIMEOUT, inside the triggerer's own limit); logs, never raises.
        """
        if self._fired or not self.cancel_on_kill:
            return
        try:
            await shielded(asyncio.wait_for(self._cancel_unless_moved(), ON_KILL_TIMEOUT))
        except Exception as exc:  # TimeoutError included
            self.log.error("Could not cancel Slurm job %s: %s", self.job_id, exc or type(exc).__name__)

    async def _observe_ownership(self) -> tuple[Claim | None, TaskView | None]:
        current = None
        if self._claim_file:
            try:
                claim_read = self._poller().kills.read_claim(self._claim_file)
                current = await asyncio.wait_for(claim_read, CLAIM_READ_TIMEOUT)
            except Exception as exc:
                module_log.warning("Could not read the claim on Slurm job %s (%s)", self.job_id, exc)
        return current, await read_task_view(getattr(self, "task_instance", None), try_key=xcom_keys.SLURM_TRY)

    async def _cancel_unless_moved(self) -> None:
        reg = self._registration
        if reg is not None and reg.superseded:
            verdict, why = Verdict.MOVED, f"{reg.superseded_by} has claimed the job"
        else:
            verdict, why = await decide(self._observe_ownership, self._claim)
        if verdict is not Verdict.CANCEL:
            message = "Not cancelling Slurm job %s on this trigger's cancellation (%s): %s"
            self.log.info(message, self.job_id, verdict.value, why)
            module_log.warning(message, self.job_id, verdict.value, why)
            return
        poller = self._poller()
        try:
            info = await poller.kills.job_state(self.job_id)
        except Exception as exc:  # cancel anyway: scancel of a job that already ended is harmless
            module_log.warning("Could not read Slurm job %s before cancelling (%s)", self.job_id, exc)
            info = None
        if info is not None and info.state.is_terminal:
            self.log.info("Slurm job %s already ended (%s): nothing to cancel", self.job_id, info.native_state)
            try:
                await poller.kills.shred(self.handle.secret_files)
            except Exception as exc:  # best effort, like the cancel itself
                module_log.warning("Could not remove the secret files of Slurm job %s (%s)", self.job_id, exc)
            return
        self.log.info("Cancelling Slurm job %s: %s", self.job_id, why)
        outcome = await self._cancel(why)
        module_log.info("Slurm job %s: %s (%s)", self.job_id, outcome, why)
