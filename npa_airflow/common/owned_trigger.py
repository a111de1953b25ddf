"""The life of a trigger that owns a job, Slurm's and Burst's: claim, wait, fire one event, and on_kill.

`OwnedJobTrigger` claims its job when it starts (see `npa_airflow.common.ownership`), waits for the job's end
(`wait()`, the backend's), fires that one event, and on a kill cancels the job only when the claim and the task
instance say a user ended the task (`cancel(why)`, the backend's); a move to another triggerer never cancels.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from npa_airflow.common.log_delivery import AFTER_EVENT_SECONDS, until_log_lines_read
from npa_airflow.common.ownership import Claim, TaskView, Verdict, decide, shielded

module_log = logging.getLogger(__name__)  # on_kill's lines also reach the triggerer's own log
# The whole of on_kill, deciding (ownership.DECIDE_SECONDS of reads) and cancelling, inside the triggerer's own
# bound ([triggerer] on_kill_timeout, 30 s by default).
ON_KILL_TIMEOUT = 25.0


class OwnedJobTrigger(BaseTrigger):
    """Fire one event when the job ends, or when `deadline` (epoch seconds) passes; cancel it on a user's kill.

    A subclass supplies `wait()` (the end event's payload), `cancel(why)`, `observe_ownership()` (the claim
    now held on the job and the task instance's view), `record_claim()` and `event_payload()`.
    """

    def __init__(self, deadline: float | None, cancel_on_kill: bool) -> None:
        super().__init__()
        self.deadline = None if deadline is None else float(deadline)
        self.cancel_on_kill = bool(cancel_on_kill)
        self._fired = False  # the event is built: on_kill has nothing left to cancel
        self._killed = False  # on_kill has run once
        self.delivers_log_lines = True  # False when the trigger running this one waits for them (SlurmStartTrigger)
        self._claim: Claim | None = None

    @property
    @abstractmethod
    def job_label(self) -> str:
        """The job as the trigger's log lines name it ("Slurm job 42")."""

    # -- the claim -------------------------------------------------------------------------------------------

    def fallback_try(self) -> int:
        """The try the claim names when the task instance does not say."""
        return 1

    @abstractmethod
    async def record_claim(self, ti: Any, claim: Claim) -> bool:
        """Make `claim` the job's current one (or arrange it); False when it could not be recorded."""

    async def _claim_job(self) -> None:
        """Claim the job for this trigger, when it runs for a task instance (not in dag.test())."""
        ti = getattr(self, "task_instance", None)
        if ti is None or self._claim is not None:
            return
        claim = Claim.new(int(getattr(ti, "try_number", None) or self.fallback_try()))
        if await self.record_claim(ti, claim):
            self._claim = claim
        else:
            self.log.warning("Could not record this trigger's claim; a move will be told from the task state only")

    # -- the wait and its event ------------------------------------------------------------------------------

    @abstractmethod
    async def wait(self) -> dict[str, Any]:
        """Wait for the job's end (or the deadline); the payload of the event to fire."""

    @abstractmethod
    def event_payload(self, status: str, message: str, **extra: Any) -> dict[str, Any]:
        """An event of this backend in the one shape (`npa_airflow.common.trigger_events`)."""

    def _fire(self, status: str, message: str, **extra: Any) -> dict[str, Any]:
        """The payload of the event that ends the wait; from here on, on_kill cancels nothing."""
        self._fired = True
        return self.event_payload(status, message, **extra)

    def _seconds_left(self) -> float | None:
        """Seconds until the deadline (negative once passed); None without one."""
        return None if self.deadline is None else self.deadline - time.time()

    def _deadline_passed(self) -> bool:
        left = self._seconds_left()
        return left is not None and left <= 0

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self._claim_job()
        payload = await self.wait()
        self._fired = True
        if self.delivers_log_lines:
            await until_log_lines_read()  # the job's last lines in the task's log, not the triggerer's
        yield TriggerEvent(payload)
        if self.delivers_log_lines:
            await until_log_lines_read(AFTER_EVENT_SECONDS)  # and Airflow's "Trigger fired event" line

    # -- a kill ----------------------------------------------------------------------------------------------

    @abstractmethod
    async def observe_ownership(self) -> tuple[Claim | None, TaskView | None]:
        """The claim now on the job (None: unreadable) and the task instance's view (None: unreadable)."""

    @abstractmethod
    async def cancel(self, why: str) -> None:
        """Cancel the job: a user ended the task. Raises when it could not; on_kill bounds the time."""

    async def kill_verdict(self) -> tuple[Verdict, str]:
        """Whether a user's action or a move ended this trigger (read for up to ownership.DECIDE_SECONDS)."""
        return await decide(self.observe_ownership, self._claim)

    async def on_kill(self) -> None:
        """Cancel the job when a user ended the deferred task (mark failed/success, clear, run failed).

        Airflow 3.3.2 also calls this when the trigger only moved to another triggerer, so the message is not
        trusted: the verdict comes from the task instance's state and the job's claim. Runs once, bounded by
        ON_KILL_TIMEOUT and shielded from the runner's repeated cancels; logs, never raises.
        """
        if self._fired or self._killed or not self.cancel_on_kill:
            return
        self._killed = True
        try:
            await shielded(asyncio.wait_for(self._cancel_unless_moved(), ON_KILL_TIMEOUT))
        except Exception as exc:  # TimeoutError included
            self.log.error("Could not cancel %s: %s", self.job_label, str(exc) or type(exc).__name__)

    async def _cancel_unless_moved(self) -> None:
        verdict, why = await self.kill_verdict()
        if verdict is not Verdict.CANCEL:
            message = "Not cancelling %s on this trigger's cancellation (%s): %s"
            self.log.info(message, self.job_label, verdict.value, why)
            module_log.warning(message, self.job_label, verdict.value, why)
            return
        await self.cancel(why)
