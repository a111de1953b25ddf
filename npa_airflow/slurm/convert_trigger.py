"""The trigger that waits for a .sqsh conversion job.

It is the shared `SlurmJobTrigger` (same poller, log streaming, deadline and on_kill), plus one rule from the
seed: a conversion PENDING on a QOS memory limit (QOSGrpMemLimit) must not be waited out. The trigger ends
the wait at once through the shared trigger's deadline path (which also cancels the job there), and the event
is flagged ``blocked_by_qos`` with the pending reason; the operator cancels too and reports what to do.
"""

from __future__ import annotations

from typing import Any

from npa_airflow.common.states import JobState
from npa_airflow.slurm.enroot import QOS_MEM_REASONS
from npa_airflow.slurm.poller import PollUpdate, Registration
from npa_airflow.slurm.triggers import SlurmJobTrigger


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
            return None  # ends the wait (the deadline path); _fire() flags the event as held by QOS
        return update

    def _fire(self, status: str, message: str, **extra: Any) -> Any:
        if status == "deadline" and self._qos_hold_reason is not None:
            message = f"Slurm job {self.job_id} is PENDING on {self._qos_hold_reason}"
            extra.update(blocked_by_qos=True, reason=self._qos_hold_reason, native_state="PENDING")
        return super()._fire(status, message, **extra)
