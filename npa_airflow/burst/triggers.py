"""BurstJobTrigger: wait for a SkyPilot launch and job in the triggerer, streaming its log into the task log."""

from __future__ import annotations

import asyncio
from typing import Any

from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.hook import SkyPilotHook
from npa_airflow.burst.joblog import XComLineCount
from npa_airflow.burst.watch import make_event, watch_job
from npa_airflow.common import xcom_keys
from npa_airflow.common.owned_trigger import OwnedJobTrigger
from npa_airflow.common.ownership import (
    Claim,
    TaskView,
    claim_xcom_is,
    read_claim_xcom,
    read_task_view,
    write_claim_xcom,
    write_xcom,
)
from npa_airflow.common.trigger_rows import as_trigger_row

PUBLISH_WAIT_SECONDS = 5.0  # for the XCom write of the job id when the event is ready


class BurstJobTrigger(OwnedJobTrigger):
    """Fire one event when the burst job of ``handle`` ends, or when ``deadline`` (epoch seconds) passes.

    :param handle: ``BurstJobHandle.to_dict()``: the trigger row and the events keep it as a dict, the trigger holds
        the ``BurstJobHandle`` (``self.handle``; ``_current`` adds the job id once the launch has one).
    :param poll_interval: seconds between status polls.
    :param deadline: epoch seconds after which a ``deadline`` event fires (the operator cancels and
        tears down); ``None`` waits without limit.
    :param stream_logs: copy the launch and job logs into the task log.
    :param cancel_on_kill: when a user kills the deferred task (mark failed/success, clear), cancel the
        launch or job and apply the handle's teardown policy. Triggerer restarts never cancel.
    :param nodes: node count, for the pending message.
    """

    def __init__(
        self,
        handle: dict[str, Any],
        poll_interval: float = 15.0,
        deadline: float | None = None,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        nodes: int | None = None,
    ) -> None:
        super().__init__(deadline, cancel_on_kill)
        self.handle = BurstJobHandle.from_dict(handle)  # validated like a new one: it may come from XCom
        self.poll_interval = float(poll_interval)
        self.stream_logs = bool(stream_logs)
        self.nodes = None if nodes is None else int(nodes)
        self._current = self.handle
        self._publishing: asyncio.Future[None] | None = None  # the XCom write of a newly learned job id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return as_trigger_row(self, ("handle", "poll_interval", "deadline", "stream_logs", "cancel_on_kill", "nodes"))

    @property
    def job_label(self) -> str:
        return f"burst job {self._current.to_json()}"

    def _hook(self) -> SkyPilotHook:
        return SkyPilotHook(self._current.conn_id)

    def _remember(self, handle: BurstJobHandle) -> None:
        learned = handle.job_id is not None and handle.job_id != self._current.job_id
        self._current = handle
        if learned and self._claim is not None:
            self._publishing = asyncio.ensure_future(self._publish(handle, self._claim))

    async def _publish(self, handle: BurstJobHandle, claim: Claim) -> None:
        """Put the job id the launch created into the task's XCom handle while the task waits, for what reads it
        there: the Compute page, the listener plugin's cancel, the next try. Only while this trigger's claim is
        the current one (a superseded trigger writes nothing)."""
        ti = getattr(self, "task_instance", None)
        if not await claim_xcom_is(ti, claim):
            return
        if not await write_xcom(ti, xcom_keys.BURST_JOB, handle.to_dict()):
            key = xcom_keys.BURST_JOB
            self.log.warning("Could not record SkyPilot job %s in the task's XCom (%s)", handle.job_id, key)

    async def record_claim(self, ti: Any, claim: Claim) -> bool:
        """In the task instance's XCom (see npa_airflow.common.ownership)."""
        return await write_claim_xcom(ti, claim)

    async def _line_count(self) -> tuple[XComLineCount | None, bool]:
        """Where the job log's line count is kept (the task's XCom, under this trigger's claim; None: in memory),
        and whether an earlier trigger of this try already followed a job on the cluster (its launch is over)."""
        if self._claim is None or not self.stream_logs:
            return None, False
        count = XComLineCount(self.task_instance, self._claim)
        recorded = await count.recorded_job()
        return count, recorded is not None and recorded.cluster == self._current.cluster

    def event_payload(self, status: str, message: str, **extra: Any) -> dict[str, Any]:
        return make_event(status, self._current, message, **extra)

    async def wait(self) -> dict[str, Any]:
        """Follow the launch, then the job (`burst.watch`, shared with the worker-side wait), to its event."""
        try:
            line_count, launch_shown = await self._line_count()
            async with self._hook() as hook:
                event = await watch_job(
                    hook,
                    self._current,
                    poll_interval=self.poll_interval,
                    deadline=self.deadline,
                    stream_logs=self.stream_logs,
                    log=self.log,
                    nodes=self.nodes,
                    on_job_id=self._remember,
                    line_count=line_count,
                    stream_launch_log=not launch_shown,
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the job's end is unknown: the operator leaves it to the next try
            event = self.event_payload("interrupted", f"waiting for the burst job failed: {exc}")
        if self._publishing is not None:  # the event's handle supersedes it; let it finish, briefly
            await asyncio.wait([self._publishing], timeout=PUBLISH_WAIT_SECONDS)
        return event

    async def observe_ownership(self) -> tuple[Claim | None, TaskView | None]:
        ti = getattr(self, "task_instance", None)
        return await read_claim_xcom(ti), await read_task_view(ti)

    async def cancel(self, why: str) -> None:
        """A user ended the task: cancel the launch or job and apply the handle's teardown policy (requests only)."""
        self.log.info("Cancelling %s: %s", self.job_label, why)
        async with self._hook() as hook:
            await hook.acancel_and_teardown(self._current, self.log, wait=False)
