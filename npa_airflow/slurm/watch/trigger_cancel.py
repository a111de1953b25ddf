"""The Slurm trigger's cancels: right away when the job can never finish in time (its deadline, a pending reason
that never clears: cancel, then fire), and when a user ended the deferred task (`cancel`, which the shared
on_kill of `npa_airflow.common.owned_trigger` calls on its verdict). `SlurmJobTrigger` extends it.

Both go through the cluster's poller (`kills`, `npa_airflow.slurm.transport.kill_batch`), so that the cancels of many
triggers of one cluster share one scancel; what is cancelled is `CancelRequest.for_handle` of the job's handle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npa_airflow.common import xcom_keys
from npa_airflow.common.owned_trigger import OwnedJobTrigger
from npa_airflow.common.ownership import Claim, TaskView, Verdict, read_task_view
from npa_airflow.common.retry import Backoff, Budget, aretry
from npa_airflow.exceptions import cluster_did_not_answer
from npa_airflow.slurm.submit.fit import NEVER_CLEARING_REASONS
from npa_airflow.slurm.transport.cancels import CancelRequest
from npa_airflow.slurm.watch.poll_bookkeeping import CLAIM_READ_TIMEOUT

if TYPE_CHECKING:
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.watch.poller import Registration, SlurmPoller

module_log = logging.getLogger(__name__)  # on_kill's lines reach the triggerer's own log
DEADLINE_CANCEL_TIMEOUT = 30.0
CANCEL_BACKOFF = Backoff(base=1.0, cap=8.0, jitter=0.5)  # between scancel attempts, inside the timeouts above


class SlurmTriggerCancels(OwnedJobTrigger):
    """The cancel half of `SlurmJobTrigger` (the trigger supplies the attributes declared here)."""

    job_id: str
    handle: SlurmJobHandle
    _registration: Registration | None
    _claim_file: str | None
    _poller: Callable[[], SlurmPoller]

    async def _deadline_event(self, message: str) -> dict[str, Any]:
        """The deadline passed: cancel here, then fire."""
        await self._cancel_here(message)
        return self._fire("deadline", message)

    async def _unsatisfiable_event(self, token: str, reason: str) -> dict[str, Any]:
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
        kills = self._poller().channel.kills  # batched with the other triggers' cancels (a whole DAG run marked failed)
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

    # -- a user's kill (OwnedJobTrigger.on_kill decides) ----------------------------------------------------

    async def kill_verdict(self) -> tuple[Verdict, str]:
        """A registration its poller saw superseded has moved: no read needed to know it."""
        reg = self._registration
        if reg is not None and reg.superseded:
            return Verdict.MOVED, f"{reg.superseded_by} has claimed the job"
        return await super().kill_verdict()

    async def observe_ownership(self) -> tuple[Claim | None, TaskView | None]:
        current = None
        if self._claim_file:
            try:
                claim_read = self._poller().channel.kills.read_claim(self._claim_file)
                current = await asyncio.wait_for(claim_read, CLAIM_READ_TIMEOUT)
            except Exception as exc:
                module_log.warning("Could not read the claim on Slurm job %s (%s)", self.job_id, exc)
        # The handle's waiting_try; slurm_try for a handle an earlier version published
        try_keys = (xcom_keys.SLURM_JOB, xcom_keys.SLURM_TRY)
        return current, await read_task_view(getattr(self, "task_instance", None), try_keys=try_keys)

    async def cancel(self, why: str) -> None:
        """A user ended the task: scancel the job unless it has ended (then only its secret files go)."""
        poller = self._poller()
        try:
            info = await poller.channel.kills.job_state(self.job_id)
        except Exception as exc:  # cancel anyway: scancel of a job that already ended is harmless
            module_log.warning("Could not read Slurm job %s before cancelling (%s)", self.job_id, exc)
            info = None
        if info is not None and info.state.is_terminal:
            self.log.info("Slurm job %s already ended (%s): nothing to cancel", self.job_id, info.native_state)
            try:
                await poller.channel.kills.shred(self.handle.secret_files)
            except Exception as exc:  # best effort, like the cancel itself
                module_log.warning("Could not remove the secret files of Slurm job %s (%s)", self.job_id, exc)
            return
        self.log.info("Cancelling Slurm job %s: %s", self.job_id, why)
        outcome = await self._cancel(why)
        module_log.info("Slurm job %s: %s (%s)", self.job_id, outcome, why)
