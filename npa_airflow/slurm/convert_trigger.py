"""The trigger that waits for a .sqsh conversion job.

It is the shared `SlurmJobTrigger` (same poller, log streaming, deadline and on_kill), plus one rule from the
seed: a conversion PENDING on a QOS memory limit (QOSGrpMemLimit) must not be waited out. The trigger cancels
the job and fires a ``held_by_qos`` event with the pending reason; the operator cancels too (idempotent) and
reports what to do.
"""

from __future__ import annotations

from typing import Any

from npa_airflow.common.states import JobState
from npa_airflow.slurm.submit.enroot import QOS_MEM_REASONS
from npa_airflow.slurm.triggers import SlurmJobTrigger
from npa_airflow.slurm.watch.poller import PollUpdate, Registration


def qos_memory_hold_reason(update: PollUpdate | None) -> str | None:
    """The pending reason when ``update`` shows a job held by a QOS memory limit, else None."""
    info = update.info if update is not None else None
    if info is None or update is None or update.state is not JobState.PENDING or not info.reason:
        return None
    return info.reason if any(r in info.reason for r in QOS_MEM_REASONS) else None


class SqshConvertTrigger(SlurmJobTrigger):
    """`SlurmJobTrigger` that also fires when the conversion job is held by a QOS memory limit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._qos_hold_reason: str | None = None

    async def _next_update(self, reg: Registration) -> PollUpdate | None:
        update = await super()._next_update(reg)
        reason = qos_memory_hold_reason(update)
        if reason is not None:
            self._qos_hold_reason = reason
            return None  # ends the wait: _event_without_update() fires the hold
        return update

    async def _event_without_update(self) -> Any:
        if self._qos_hold_reason is None:
            return await super()._event_without_update()
        message = f"Slurm job {self.job_id} is PENDING on {self._qos_hold_reason}"
        await self._cancel_here(message)
        extra = {"blocked_by_qos": True, "reason": self._qos_hold_reason, "native_state": "PENDING"}
        return self._fire("held_by_qos", message, **extra)
