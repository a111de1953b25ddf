"""Waiting for a burst job and cancelling it: the logic shared by the trigger and the worker-side wait.

``watch_job`` follows the launch request until SkyPilot reports the job id, then the job until it ends,
streaming both logs into the task log and saying at each poll why it is still pending. Cancel and
teardown are written once as a sequence of API steps (``cancel_steps``) that a sync or an async client
executes (``run_steps`` / ``arun_steps``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Generator
from typing import Any

from npa_airflow.burst import client as sky
from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaConnectionError, NpaError

EVENT_STATUSES = ("success", "failed", "canceled", "deadline")
LOG_DRAIN_SECONDS = 30.0
MAX_UNREACHABLE_SECONDS = 1800.0
MAX_CONSECUTIVE_API_ERRORS = 5
TEARDOWN_ATTEMPTS = 3
TEARDOWN_RETRY_SECONDS = 5.0
_TOLERATED_ON_CANCEL = ("ClusterDoesNotExist", "ClusterNotUpError")


def make_event(status: str, handle: BurstJobHandle, message: str, native_state: str | None = None) -> dict[str, Any]:
    if status not in EVENT_STATUSES:
        raise ValueError(f"unknown burst event status {status!r}; expected one of {EVENT_STATUSES}")
    return {"status": status, "handle": handle.to_dict(), "message": message, "native_state": native_state}


def validate_event(event: Any) -> tuple[str, BurstJobHandle, str]:
    if not isinstance(event, dict):
        raise ValueError(f"burst trigger event must be a dict, got {type(event).__name__}: {event!r}")
    missing = [k for k in ("status", "handle", "message") if k not in event]
    if missing or event["status"] not in EVENT_STATUSES:
        raise ValueError(f"malformed burst trigger event (missing {missing}, status {event.get('status')!r})")
    return event["status"], BurstJobHandle.from_dict(event["handle"]), str(event["message"])


async def _pump(lines, log: logging.Logger, prefix: str) -> None:
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


class _Unreachable:
    """How long the API server has been unreachable; the wait fails only after a bounded outage."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.since: float | None = None

    def ok(self) -> None:
        self.since = None

    def failed(self, exc: Exception, log: logging.Logger) -> bool:
        now = time.monotonic()
        self.since = self.since or now
        log.warning("SkyPilot API server not answering (%s); retrying", exc)
        return now - self.since > self.limit


async def watch_job(
    client: sky.AsyncSkyPilotClient,
    handle: BurstJobHandle,
    *,
    poll_interval: float,
    deadline: float | None,
    stream_logs: bool,
    log: logging.Logger,
    nodes: int | None = None,
    on_job_id: Any = None,
) -> dict[str, Any]:
    """Follow ``handle`` until it ends (or ``deadline``, epoch seconds); return the event payload."""
    outage = _Unreachable(MAX_UNREACHABLE_SECONDS)
    gang = f"all {nodes} node(s)" if nodes else "all nodes"

    def past_deadline() -> bool:
        return deadline is not None and time.time() > deadline

    if handle.job_id is None:
        stream = None
        if stream_logs:
            request = sky.ApiRequest(
                "GET", "/api/stream", params={"request_id": handle.request_id, "follow": "true", "format": "plain"}
            )
            stream = asyncio.ensure_future(_pump(client.stream_lines(request), log, "[launch] "))
        try:
            while True:
                try:
                    result = (await client.request_statuses([handle.request_id])).get(handle.request_id)
                    outage.ok()
                except NpaConnectionError as exc:
                    if outage.failed(exc, log):
                        return make_event("failed", handle, f"SkyPilot API server unreachable: {exc}")
                    await asyncio.sleep(poll_interval)
                    continue
                if result is None:
                    return make_event(
                        "failed", handle, f"launch request {handle.request_id} is unknown to the API server"
                    )
                if result.finished:
                    break
                log.info(
                    "Launch of cluster %s (request %s) is %s: %s",
                    handle.cluster,
                    handle.request_id,
                    result.status,
                    result.status_msg or f"provisioning; gang scheduling waits until {gang} are allocated",
                )
                if past_deadline():
                    return make_event("deadline", handle, "deadline passed while the cluster was being launched")
                await asyncio.sleep(poll_interval)
        finally:
            await _stop(stream, LOG_DRAIN_SECONDS if stream_logs else 0)
        result = await client.get(handle.request_id, timeout=120)
        if result.status == "CANCELLED":
            return make_event("canceled", handle, f"launch request {handle.request_id} was cancelled")
        if result.error_type or result.status != "SUCCEEDED":
            return make_event(
                "failed",
                handle,
                f"launch of cluster {handle.cluster} failed: {result.error_type}: {result.error_message}",
            )
        job_id = sky.parse_launch_result(result.return_value)
        if job_id is None:
            return make_event("failed", handle, f"launch of cluster {handle.cluster} returned no job id")
        handle = handle.with_job(job_id)
        if on_job_id is not None:
            on_job_id(handle)
        log.info("SkyPilot job %s submitted on cluster %s", job_id, handle.cluster)

    assert handle.job_id is not None
    stream = None
    if stream_logs:
        logs = sky.build_logs(client.identity, handle.cluster, handle.job_id, follow=True)
        stream = asyncio.ensure_future(_pump(client.stream_lines(logs), log, ""))
    native: str | None = None
    api_errors = 0
    try:
        while True:
            try:
                value = await client.call(
                    sky.build_job_status(client.identity, handle.cluster, [handle.job_id]), timeout=120
                )
                native = sky.parse_job_status(value, handle.job_id)
                outage.ok()
            except NpaConnectionError as exc:
                if outage.failed(exc, log):
                    return make_event("failed", handle, f"SkyPilot API server unreachable: {exc}", native)
                await asyncio.sleep(poll_interval)
                continue
            except sky.SkyPilotApiError as exc:
                if exc.error_type in _TOLERATED_ON_CANCEL:
                    return make_event("failed", handle, f"cluster {handle.cluster} is gone: {exc}", native)
                # The server could not reach the cluster this time (e.g. the scheduler timed out): retry
                # a few polls before calling the job's state unknown-and-failed.
                api_errors += 1
                if api_errors >= MAX_CONSECUTIVE_API_ERRORS:
                    return make_event("failed", handle, f"job status unavailable {api_errors} times: {exc}", native)
                log.warning("Job status of %s on %s failed (%s); retrying", handle.job_id, handle.cluster, exc)
                await asyncio.sleep(poll_interval)
                continue
            api_errors = 0
            state = sky.interpret_job_state(native)
            if state.is_terminal:
                break
            if state is JobState.PENDING:
                log.info(
                    "SkyPilot job %s on %s is %s: waiting until %s are allocated (gang scheduling)",
                    handle.job_id,
                    handle.cluster,
                    native,
                    gang,
                )
            elif state is JobState.UNKNOWN:
                log.warning("SkyPilot job %s on %s reports state %r", handle.job_id, handle.cluster, native)
            if past_deadline():
                return make_event("deadline", handle, f"deadline passed with job {handle.job_id} {native}", native)
            await asyncio.sleep(poll_interval)
    finally:
        # A terminal job's follow stream ends by itself; give it time to deliver the last lines.
        await _stop(stream, LOG_DRAIN_SECONDS)
    description = f"SkyPilot job {handle.job_id} ({handle.name}) on cluster {handle.cluster} ended {native}"
    if state is JobState.COMPLETE:
        return make_event("success", handle, description, native)
    if state is JobState.CANCELED:
        return make_event("canceled", handle, description, native)
    return make_event("failed", handle, description, native)


# ---------------------------------------------------------------- cancel and teardown

Step = tuple[str, Any]


def cancel_steps(
    handle: BurstJobHandle,
    identity: sky.Identity,
    log: logging.Logger,
    *,
    cancel: bool = True,
    teardown: bool = True,
    wait: bool = True,
) -> Generator[Step, Any, None]:
    """Cancel the launch request or the job, then tear the cluster down when the policy says so.

    Yields ``("statuses", [ids])``, ``("cancel", [ids])``, ``("get", id)``, ``("call", ApiRequest)``,
    ``("submit", ApiRequest)``, ``("sleep", seconds)`` and receives each answer (or the exception it raised).
    Every step tolerates "already gone". With ``wait=False`` the job cancel and the teardown are only
    submitted: the API server carries them out on its own, which fits a caller with a short time bound
    (the triggerer gives ``on_kill`` 30 s; a teardown can take minutes).
    """
    if not wait:
        yield from _submit_cancel_steps(handle, identity, log, cancel=cancel, teardown=teardown)
        return
    job_id = handle.job_id
    if cancel and job_id is None:
        job_id = yield from _stop_launch(handle, log)
    if cancel and job_id is not None:
        answer = yield ("call", sky.build_cancel_job(identity, handle.cluster, int(job_id)))
        if isinstance(answer, Exception):
            log.info("Cancel of job %s on %s: %s", job_id, handle.cluster, answer)
        else:
            log.info("Cancelled SkyPilot job %s on cluster %s", job_id, handle.cluster)
    if teardown and handle.tears_down:
        for attempt in range(1, TEARDOWN_ATTEMPTS + 1):
            answer = yield ("call", sky.build_down(identity, handle.cluster))
            if not isinstance(answer, Exception):
                log.info("Cluster %s torn down", handle.cluster)
                break
            if getattr(answer, "error_type", None) == "ClusterDoesNotExist":
                log.info("Cluster %s is already gone", handle.cluster)
                break
            if attempt == TEARDOWN_ATTEMPTS:
                log.warning(
                    "Teardown of cluster %s failed %d times (%s); it may still hold nodes: take it down with "
                    "`sky down %s` against %s",
                    handle.cluster,
                    attempt,
                    answer,
                    handle.cluster,
                    handle.endpoint,
                )
                break
            log.info("Teardown of cluster %s failed (%s); retrying", handle.cluster, answer)
            yield ("sleep", TEARDOWN_RETRY_SECONDS * attempt)
    elif teardown:
        log.info("Cluster %s kept (teardown=%s)", handle.cluster, handle.teardown)


def _stop_launch(handle: BurstJobHandle, log: logging.Logger) -> Generator[Step, Any, int | None]:
    """Cancel a launch still in flight (quick requests); return the job id a finished launch created."""
    answer = yield ("statuses", [handle.request_id])
    launch = answer.get(handle.request_id) if isinstance(answer, dict) else None
    if launch is not None and not launch.finished:
        answer = yield ("cancel", [handle.request_id])
        log.info("Cancelled launch request %s: %s", handle.request_id, answer)
    elif launch is not None and launch.status == "SUCCEEDED":
        result = yield ("get", handle.request_id)
        if isinstance(result, sky.RequestResult) and isinstance(result.return_value, dict):
            return result.return_value.get("job_id")
    return None


def _submit_cancel_steps(
    handle: BurstJobHandle, identity: sky.Identity, log: logging.Logger, *, cancel: bool, teardown: bool
) -> Generator[Step, Any, None]:
    job_id = handle.job_id
    if cancel and job_id is None:
        job_id = yield from _stop_launch(handle, log)
    if cancel and job_id is not None:
        answer = yield ("submit", sky.build_cancel_job(identity, handle.cluster, int(job_id)))
        log.info("Cancel of SkyPilot job %s on cluster %s requested: %s", job_id, handle.cluster, answer)
    if teardown and handle.tears_down:
        answer = yield ("submit", sky.build_down(identity, handle.cluster))
        log.info("Teardown of cluster %s requested: %s", handle.cluster, answer)
    elif teardown:
        log.info("Cluster %s kept (teardown=%s)", handle.cluster, handle.teardown)


def _tolerable(exc: Exception) -> bool:
    return isinstance(exc, NpaError)


def run_steps(client: sky.SkyPilotClient, steps: Generator[Step, Any, None]) -> None:
    answer: Any = None
    while True:
        try:
            op, arg = steps.send(answer)
        except StopIteration:
            return
        try:
            if op == "statuses":
                answer = client.request_statuses(arg)
            elif op == "cancel":
                answer = client.cancel_requests(arg)
            elif op == "get":
                answer = client.get(arg, timeout=120)
            elif op == "sleep":
                time.sleep(arg)
                answer = None
            elif op == "submit":
                answer = client.submit(arg)
            else:
                answer = client.call(arg, timeout=600)
        except Exception as exc:
            if not _tolerable(exc):
                raise
            answer = exc


async def arun_steps(client: sky.AsyncSkyPilotClient, steps: Generator[Step, Any, None]) -> None:
    answer: Any = None
    while True:
        try:
            op, arg = steps.send(answer)
        except StopIteration:
            return
        try:
            if op == "statuses":
                answer = await client.request_statuses(arg)
            elif op == "cancel":
                answer = await client.cancel_requests(arg)
            elif op == "get":
                answer = await client.get(arg, timeout=120)
            elif op == "sleep":
                await asyncio.sleep(arg)
                answer = None
            elif op == "submit":
                answer = await client.submit(arg)
            else:
                answer = await client.call(arg, timeout=600)
        except Exception as exc:
            if not _tolerable(exc):
                raise
            answer = exc
