"""Waiting for a burst job: the logic shared by the trigger and the worker-side wait, and their events.

``watch_job`` follows the launch request until SkyPilot reports the job id, then the job until it ends,
streaming both logs into the task log and saying at each poll why it is still pending. What is asked of the
API server, and how, is the hook's (``SkyPilotHook``); this module decides when to ask and what the answers mean.

Every call of the wait (reading the connection, the launch's state and result, the job's state) shares one
outage budget: while the API server does not answer, the watch keeps asking; once the outage outlasts
``MAX_UNREACHABLE_SECONDS``, or the wait breaks for a reason it does not know, it ends ``interrupted``: the job's
end is unknown, so the operator fails the try for a retry and leaves the job and its cluster to the next try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk.exceptions import AirflowNotFoundException

from npa_airflow.burst import client as sky
from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.joblog import JobLog, JobLogFollower, LineCount, finish_job_log
from npa_airflow.burst.usage import usage_fields
from npa_airflow.common import trigger_events
from npa_airflow.common.remote_errors import skypilot_cluster_gone
from npa_airflow.common.retry import Backoff, Budget, apause
from npa_airflow.common.states import JobState
from npa_airflow.common.usage import ENDED_FIRST
from npa_airflow.exceptions import NpaConnectionError, NpaValidationError

if TYPE_CHECKING:
    from npa_airflow.burst.hook import SkyPilotHook

T = TypeVar("T")

# "interrupted": the wait stopped before the job's end was known (the job and its cluster are left running).
EVENT_STATUSES = ("success", "failed", "canceled", "deadline", "interrupted")
LOG_DRAIN_SECONDS = 30.0
MAX_UNREACHABLE_SECONDS = 1800.0
MAX_CONSECUTIVE_API_ERRORS = 5
# Why an event's usage is None when no job ran (its `usage_unknown`; a wait that ended first: common.usage).
NO_JOB_RAN = "no job ran: the launch did not finish"


def make_event(
    status: str, handle: BurstJobHandle, message: str, native_state: str | None = None, **usage: Any
) -> dict[str, Any]:
    """An event; ``usage`` is `burst.usage.usage_fields` of the job's end (default: unknown, and why)."""
    if not usage:
        why = NO_JOB_RAN if handle.job_id is None else ENDED_FIRST
        usage = {"usage": None, "usage_unknown": why}
    return trigger_events.make_event(
        "burst", EVENT_STATUSES, status, handle.to_dict(), message, native_state=native_state, **usage
    )


def validate_event(event: Any) -> dict[str, Any]:
    """Check an event before the operator acts on it (its handle: `event_handle`); a ValueError names what is wrong."""
    return trigger_events.check_event(event, "burst", EVENT_STATUSES)


def event_handle(event: dict[str, Any]) -> BurstJobHandle:
    return BurstJobHandle.from_dict(event["handle"])


async def _pump(lines: AsyncIterator[str], log: logging.Logger, prefix: str) -> None:
    try:
        async for raw in lines:
            line = sky.clean_log_line(raw)
            if line is not None:
                log.info("%s%s", prefix, line)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the log is a view; losing it must not fail the wait
        log.warning("%slog stream ended: %s", prefix, exc)


async def _stop(task: asyncio.Task | None, drain: float) -> None:
    if task is None:
        return
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
        await asyncio.wait_for(asyncio.shield(task), timeout=drain)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


class _Ended(Exception):
    """The watch is over before the job ended by itself; carries the event to fire."""

    def __init__(self, event: dict[str, Any]) -> None:
        super().__init__(event["message"])
        self.event = event


@dataclass
class _Outage:
    """How long the API server has been unreachable; the wait fails only after a bounded outage."""

    limit: float
    budget: Budget | None = None

    def ok(self) -> None:
        self.budget = None

    def failed(self, exc: Exception, log: logging.Logger) -> bool:
        """Record a failed poll; True once the outage outlasted ``limit`` seconds."""
        if self.budget is None:
            self.budget = Budget(seconds=self.limit)
        log.warning("SkyPilot API server or its connection unavailable (%s); retrying", exc)
        return not self.budget.allows(0.0)


@dataclass
class _JobWatch:
    hook: SkyPilotHook
    poll_interval: float
    deadline: float | None
    stream_logs: bool
    log: logging.Logger
    gang: str
    on_job_id: Callable[[BurstJobHandle], None] | None
    line_count: LineCount | None = None
    outage: _Outage = field(default_factory=lambda: _Outage(MAX_UNREACHABLE_SECONDS))
    # The current streak of job-status errors, retried at the poll interval (no growth: the poll is slow already).
    api_errors: Budget = field(default_factory=lambda: Budget(attempts=MAX_CONSECUTIVE_API_ERRORS))

    @property
    def api_error_backoff(self) -> Backoff:
        return Backoff(base=self.poll_interval, cap=self.poll_interval, jitter=0.0)

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    async def poll_pause(self) -> None:
        await apause(self.poll_interval)

    def stream(self, lines: AsyncIterator[str], prefix: str) -> asyncio.Future | None:
        return asyncio.ensure_future(_pump(lines, self.log, prefix)) if self.stream_logs else None

    async def unreachable(self, handle: BurstJobHandle, exc: Exception, native: str | None = None) -> None:
        """A call the API server did not answer: pause, or end the watch once the outage is too long."""
        if self.outage.failed(exc, self.log):
            message = f"SkyPilot API server unreachable for more than {self.outage.limit:.0f} s: {exc}"
            raise _Ended(make_event("interrupted", handle, message, native))
        await self.poll_pause()

    async def ask(self, handle: BurstJobHandle, call: Callable[[], Awaitable[T]], native: str | None = None) -> T:
        """One answer, waiting out an outage within the watch's one budget. The connection is read on the first
        call; the triggerer reports a connection it could not fetch as not defined, so that waits too."""
        while True:
            try:
                answer = await call()
            except (NpaConnectionError, AirflowNotFoundException) as exc:
                await self.unreachable(handle, exc, native)
                continue
            except NpaValidationError as exc:  # a connection that can never work: nothing to wait for
                raise _Ended(make_event("interrupted", handle, f"the SkyPilot connection is unusable: {exc}")) from exc
            self.outage.ok()
            return answer

    # -- the launch ----------------------------------------------------------------------------------------------

    async def follow_launch(self, handle: BurstJobHandle, stream_log: bool = True) -> BurstJobHandle:
        """Wait for the launch request to finish; the handle with the job id it created."""
        stream = self.stream(self.hook.astream_launch_log(handle.request_id), "[launch] ") if stream_log else None
        try:
            await self.wait_for_launch(handle)
        finally:
            await _stop(stream, LOG_DRAIN_SECONDS if self.stream_logs else 0)
        result = await self.ask(handle, lambda: self.hook.alaunch_result(handle.request_id))
        handle = handle.with_job(self.launched_job_id(handle, result))
        if self.on_job_id is not None:
            self.on_job_id(handle)
        self.log.info("SkyPilot job %s submitted on cluster %s", handle.job_id, handle.cluster)
        return handle

    async def wait_for_launch(self, handle: BurstJobHandle) -> None:
        while True:
            result = await self.ask(handle, lambda: self.hook.alaunch_status(handle.request_id))
            if result is None:
                message = f"launch request {handle.request_id} is unknown to the API server"
                raise _Ended(make_event("interrupted", handle, message))
            if result.finished:
                return
            self.log.info(
                "Launch of cluster %s (request %s) is %s: %s",
                handle.cluster,
                handle.request_id,
                result.status,
                result.status_msg or f"provisioning; gang scheduling waits until {self.gang} are allocated",
            )
            if self.past_deadline():
                raise _Ended(make_event("deadline", handle, "deadline passed while the cluster was being launched"))
            await self.poll_pause()

    @staticmethod
    def launched_job_id(handle: BurstJobHandle, result: sky.RequestResult) -> int:
        if result.status == "CANCELLED":
            raise _Ended(make_event("canceled", handle, f"launch request {handle.request_id} was cancelled"))
        if result.error_type or result.status != "SUCCEEDED":
            message = f"launch of cluster {handle.cluster} failed: {result.error_type}: {result.error_message}"
            raise _Ended(make_event("failed", handle, message))
        job_id = sky.parse_launch_result(result.return_value)
        if job_id is None:
            raise _Ended(make_event("failed", handle, f"launch of cluster {handle.cluster} returned no job id"))
        return job_id

    # -- the job -------------------------------------------------------------------------------------------------

    async def follow_job(self, handle: BurstJobHandle) -> dict[str, Any]:
        """Poll the job until it ends; its event."""
        assert handle.job_id is not None
        follower = task = None
        if self.stream_logs:
            follower = JobLogFollower(self.hook, JobLog(handle.cluster, handle.job_id), self.log, self.line_count)
            task = asyncio.ensure_future(follower.run())
        native: str | None = None
        ended = False
        try:
            while True:
                answered, native = await self.read_job_state(handle, native)
                if not answered:
                    continue
                state = sky.interpret_job_state(native)
                if state.is_terminal:
                    ended = True
                    return job_end_event(handle, native, state, **(await self.end_usage(handle)))
                self.report_pending(handle, native, state)
                if self.past_deadline():
                    message = f"deadline passed with job {handle.job_id} {native}"
                    raise _Ended(make_event("deadline", handle, message, native))
                await self.poll_pause()
        finally:
            # After the job's end the follower reads its log to the end; otherwise it stops at once.
            await finish_job_log(follower, task, LOG_DRAIN_SECONDS, ended)

    async def read_job_state(self, handle: BurstJobHandle, native: str | None) -> tuple[bool, str | None]:
        """``(True, state)`` on an answer; ``(False, last state)`` after a tolerated failure and a pause."""
        assert handle.job_id is not None
        job_id = handle.job_id
        try:
            native = await self.ask(handle, lambda: self.hook.ajob_status(handle.cluster, job_id), native)
            self.api_errors = Budget(attempts=MAX_CONSECUTIVE_API_ERRORS)
            return True, native
        except sky.SkyPilotApiError as exc:
            await self.api_error(handle, exc, native)
        return False, native

    async def api_error(self, handle: BurstJobHandle, exc: sky.SkyPilotApiError, native: str | None) -> None:
        """The server answered with an error: the cluster is gone, or it could not reach it this time (e.g. the
        scheduler timed out), which a few polls in a row may be before the job's state counts as lost."""
        if skypilot_cluster_gone(exc.error_type):
            raise _Ended(make_event("failed", handle, f"cluster {handle.cluster} is gone: {exc}", native))
        delay = self.api_error_backoff.delay(self.api_errors.failures + 1)
        if not self.api_errors.allows(delay):
            message = f"job status unavailable {self.api_errors.failures} times: {exc}"
            raise _Ended(make_event("interrupted", handle, message, native))
        self.log.warning("Job status of %s on %s failed (%s); retrying", handle.job_id, handle.cluster, exc)
        await apause(delay)

    async def end_usage(self, handle: BurstJobHandle) -> dict[str, Any]:
        """The ended job's usage from its job queue record: one more request (``/job_status`` carries no times).
        Read once: an error leaves the usage unknown, never the job's outcome."""
        assert handle.job_id is not None
        try:
            record = await self.hook.ajob_record(handle.cluster, handle.job_id)
        except Exception as exc:
            self.log.warning("Could not read job %s's record on %s: %s", handle.job_id, handle.cluster, exc)
            return usage_fields(None, f"the job queue could not be read: {exc}")
        return usage_fields(record)

    def report_pending(self, handle: BurstJobHandle, native: str | None, state: JobState) -> None:
        if state is JobState.PENDING:
            self.log.info(
                "SkyPilot job %s on %s is %s: waiting until %s are allocated (gang scheduling)",
                *(handle.job_id, handle.cluster, native, self.gang),
            )
        elif state is JobState.UNKNOWN:
            self.log.warning("SkyPilot job %s on %s reports state %r", handle.job_id, handle.cluster, native)


def job_end_event(handle: BurstJobHandle, native: str | None, state: JobState, **usage: Any) -> dict[str, Any]:
    description = f"SkyPilot job {handle.job_id} ({handle.name}) on cluster {handle.cluster} ended {native}"
    if state is JobState.COMPLETE:
        return make_event("success", handle, description, native, **usage)
    if state is JobState.CANCELED:
        return make_event("canceled", handle, description, native, **usage)
    return make_event("failed", handle, description, native, **usage)


async def watch_job(
    hook: SkyPilotHook,
    handle: BurstJobHandle,
    *,
    poll_interval: float,
    deadline: float | None,
    stream_logs: bool,
    log: logging.Logger,
    nodes: int | None = None,
    on_job_id: Callable[[BurstJobHandle], None] | None = None,
    line_count: LineCount | None = None,
    stream_launch_log: bool = True,
) -> dict[str, Any]:
    """Follow ``handle`` until it ends (or ``deadline``, epoch seconds); return the event payload.

    ``line_count`` keeps how many lines of the job's log are in the task log (`joblog`; default: in memory);
    ``stream_launch_log=False`` leaves out the launch's log (an earlier trigger of this try showed it).
    """
    gang = f"all {nodes} node(s)" if nodes else "all nodes"
    latest = handle

    def remember(current: BurstJobHandle) -> None:
        nonlocal latest
        latest = current
        if on_job_id is not None:
            on_job_id(current)

    watch = _JobWatch(hook, poll_interval, deadline, stream_logs, log, gang, remember, line_count)
    try:
        await watch.ask(handle, hook.aclient)
        if handle.job_id is None:
            handle = await watch.follow_launch(handle, stream_launch_log)
        return await watch.follow_job(handle)
    except _Ended as ended:
        return ended.event
    except Exception as exc:  # a wait that breaks leaves the job alone: its end is unknown
        log.exception("Waiting for burst job %s failed", latest.to_json())
        return make_event("interrupted", latest, f"waiting for the burst job failed: {type(exc).__name__}: {exc}")
