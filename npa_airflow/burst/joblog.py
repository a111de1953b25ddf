"""A Burst job's log in the task log: every line once, in order, across API-server outages and triggerer restarts.

SkyPilot's ``/logs`` has no offset, only ``tail=N``: the last N lines of the log as it is when the request
arrives. While the job writes, that end moves, so no N names "the lines after the K-th". The follower therefore
reads the whole log (``tail=0``, followed) and skips the K job lines the task log already has
(`client.joblog` tells the job's lines from the server's own): each reopen reads the log's start again. After an
error, or a stream that ended before the log did, it reopens the stream (`REOPEN_BACKOFF`), until SkyPilot's
end-of-log trailer arrives or, once the job is over, one read reached the end of the log.

K is kept in a `LineCount`. A trigger keeps it in the task instance's XCom ``npa_burst_log_lines`` (saved at most
once a second while lines flow, and when the trigger stops), so a restarted triggerer resumes after line K. Lines
are written and K saved only while the trigger's claim (`npa_airflow.common.ownership`) is the current one,
checked again after `CLAIM_FRESH_SECONDS` (and so after any stall longer than that): a trigger that another
triggerer took over writes no more lines and never winds K back. A worker-side wait keeps K in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from npa_airflow.burst import client as sky
from npa_airflow.burst.client.joblog import LineKind, LogStreamParser, StreamLine
from npa_airflow.common import xcom_keys
from npa_airflow.common.ownership import Claim, claim_xcom_is, read_xcom, write_xcom
from npa_airflow.common.retry import Backoff, apause

if TYPE_CHECKING:
    from npa_airflow.burst.hook import SkyPilotHook

CLAIM_FRESH_SECONDS = 5.0  # lines are written without asking again this long after the claim was found current
SAVE_SPACING_SECONDS = 1.0  # the count is saved at most this often
SAVE_TIMEOUT = 10.0
FINAL_SAVE_SECONDS = 15.0  # the save when the follower stops: a claim read and a write
# 1 s, 2 s, 4 s ... 15 s, each stretched by up to half again (every follower of a triggerer fails together).
REOPEN_BACKOFF = Backoff(base=1.0, cap=15.0, jitter=0.5)


@dataclass(frozen=True)
class JobLog:
    """The log being followed: one job on one cluster."""

    cluster: str
    job_id: int


class LineCount(Protocol):
    """Where the number of the job's log lines that the task log has is kept."""

    async def load(self, job: JobLog) -> int:
        """The count kept for ``job``; 0 when none."""

    async def owned(self) -> bool:
        """False once another trigger follows the job: write nothing more."""

    async def save(self, job: JobLog, lines: int) -> bool:
        """Keep ``lines`` for ``job``; False when it could not be kept."""


class MemoryLineCount:
    """The count in memory: survives reopening the stream, not a restart."""

    def __init__(self) -> None:
        self.kept: dict[JobLog, int] = {}

    async def load(self, job: JobLog) -> int:
        return self.kept.get(job, 0)

    async def owned(self) -> bool:
        return True

    async def save(self, job: JobLog, lines: int) -> bool:
        self.kept[job] = lines
        return True


def line_count_value(try_number: int, job: JobLog, lines: int) -> str:
    """The XCom value: ``"<try> <cluster> <job id> <lines>"``."""
    return f"{int(try_number)} {job.cluster} {int(job.job_id)} {int(lines)}"


def parse_line_count(value: Any) -> tuple[int, JobLog, int] | None:
    """``(try, job, lines)`` from an XCom value; None when absent or damaged."""
    parts = value.split() if isinstance(value, str) else []
    if len(parts) != 4 or not all(p.isdigit() for p in (parts[0], parts[2], parts[3])):
        return None
    return int(parts[0]), JobLog(parts[1], int(parts[2])), int(parts[3])


class XComLineCount:
    """The count in the task instance's XCom, kept for one try and written only while ``claim`` is current."""

    def __init__(self, ti: Any, claim: Claim) -> None:
        self.ti = ti
        self.claim = claim

    async def recorded_job(self) -> JobLog | None:
        """The job this try's log count was kept for, if any (its launch is over then)."""
        record = parse_line_count(await read_xcom(self.ti, xcom_keys.BURST_LOG_LINES))
        return record[1] if record is not None and record[0] == self.claim.try_number else None

    async def load(self, job: JobLog) -> int:
        record = parse_line_count(await read_xcom(self.ti, xcom_keys.BURST_LOG_LINES))
        return record[2] if record is not None and record[:2] == (self.claim.try_number, job) else 0

    async def owned(self) -> bool:
        return await claim_xcom_is(self.ti, self.claim)

    async def save(self, job: JobLog, lines: int) -> bool:
        value = line_count_value(self.claim.try_number, job, lines)
        return await write_xcom(self.ti, xcom_keys.BURST_LOG_LINES, value, timeout=SAVE_TIMEOUT)


class _Superseded(Exception):
    """Another trigger follows the job now."""


class JobLogFollower:
    """Copies one job's log into ``log``: `run` returns once the log is complete (or is cancelled)."""

    def __init__(self, hook: SkyPilotHook, job: JobLog, log: logging.Logger, count: LineCount | None = None) -> None:
        self.hook = hook
        self.job = job
        self.log = log
        self.count: LineCount = count if count is not None else MemoryLineCount()
        self.lines = 0  # the job's lines the task log has
        self.received = 0  # pieces of text received: how a drain tells progress
        self.superseded = False
        self._saved: int | None = None
        self._checked_at: float | None = None
        self._ended = asyncio.Event()
        self._unsaved = asyncio.Event()

    def job_ended(self) -> None:
        """The job is over: one read to the end completes the log; a pending reopen goes now."""
        self._ended.set()

    async def run(self) -> None:
        self.lines = await self.count.load(self.job)
        if self.lines:
            self.log.info(
                "Resuming the log of SkyPilot job %s after its first %d lines (already in this log; a line written"
                " just before a triggerer stalled or died may show again below)",
                *(self.job.job_id, self.lines),
            )
        self._unsaved.set()  # record the job even before its first line: a restart then skips the launch log
        saver = asyncio.ensure_future(self._keep_saved())
        try:
            await self._follow()
        finally:
            saver.cancel()
            await asyncio.wait({saver})
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._save(), FINAL_SAVE_SECONDS)

    async def _follow(self) -> None:
        failures = 0
        while True:
            after_end = self._ended.is_set()
            before = self.lines
            try:
                if await self._read():
                    return
                error: Exception | None = None
            except _Superseded:
                return
            except Exception as exc:  # any failure of the stream: open it again
                error = exc
            if error is None and after_end:
                return  # read to its end after the job was over: nothing more will come
            failures = 1 if self.lines > before else failures + 1
            if failures == 1:
                self.log.log(
                    logging.WARNING if error else logging.INFO,
                    "The log stream of SkyPilot job %s on %s %s; reopening it, to resume after line %d",
                    *(self.job.job_id, self.job.cluster, f"failed ({error})" if error else "ended early", self.lines),
                )
            ended = self._ended.is_set()
            await apause(REOPEN_BACKOFF.delay(failures), wake=None if ended else self._ended)

    async def _read(self) -> bool:
        """Read the log from its start, writing the lines after the first ``self.lines``; True once complete."""
        skip = self.lines
        async with contextlib.aclosing(self._stream()) as stream:
            async for line in stream:
                if line.kind is LineKind.NOTE:
                    self.log.debug("SkyPilot: %s", line.text)
                if line.kind is LineKind.JOB or (line.kind is LineKind.END and line.text):
                    if skip:
                        skip -= 1
                    else:
                        await self._write(line.text)
                if line.kind is LineKind.END:
                    if not line.text:
                        await self._last_line_without_newline()
                    if await self._still_owned():
                        self.log.info("Job finished (status: %s).", line.status)
                    return True
        return False

    async def _stream(self) -> AsyncIterator[StreamLine]:
        parser = LogStreamParser()
        async for text in self.hook.astream_job_log(self.job.cluster, self.job.job_id):
            self.received += 1
            for line in parser.feed(text):
                yield line
        for line in parser.finish():
            yield line

    async def _last_line_without_newline(self) -> None:
        """A followed stream leaves out a last line that has no newline; a read of the finished log's last
        line has it glued to the trailer."""
        try:
            text = await self.hook.ajob_log_end(self.job.cluster, self.job.job_id)
        except Exception as exc:  # the log is complete but for such a line
            self.log.debug("Could not read the end of the log of job %s: %s", self.job.job_id, exc)
            return
        parser = LogStreamParser(from_start=False)
        for line in [*parser.feed(text), *parser.finish()]:
            if line.kind is LineKind.END and line.text:
                await self._write(line.text)

    async def _write(self, text: str) -> None:
        if not await self._still_owned():
            raise _Superseded
        shown = sky.clean_log_line(text)
        if shown is not None:
            self.log.info("%s", shown)
        self.lines += 1
        self._unsaved.set()

    async def _still_owned(self) -> bool:
        if self.superseded:
            return False
        if self._checked_at is not None and time.monotonic() - self._checked_at < CLAIM_FRESH_SECONDS:
            return True
        owned = await self.count.owned()
        self._checked_at = time.monotonic()
        if not owned and not self.superseded:
            self.superseded = True
            self.log.info(
                "Another trigger follows SkyPilot job %s now; this one writes no more of its log", self.job.job_id
            )
        return owned

    async def _keep_saved(self) -> None:
        # The spacing counts from a save's start: a line that comes a spacing after the last save began is saved
        # at once. (Counted from its end, each save's latency would push the next one later, until the count
        # trailed the log by up to a spacing: the lines a takeover then shows twice.)
        started = -SAVE_SPACING_SECONDS
        while True:
            await self._unsaved.wait()
            await apause(started + SAVE_SPACING_SECONDS - time.monotonic())
            self._unsaved.clear()
            started = time.monotonic()
            if not await self._save():
                self._unsaved.set()

    async def _save(self) -> bool:
        """Keep the count while this trigger holds the job; True when nothing is left to keep."""
        lines = self.lines
        if lines == self._saved or not await self._still_owned():
            return True
        if await self.count.save(self.job, lines):
            self._saved = lines
            return True
        return False


async def finish_job_log(
    follower: JobLogFollower | None, task: asyncio.Future | None, drain: float, ended: bool
) -> None:
    """Stop following: after the job's end, let the follower read to the end of the log as long as text keeps
    arriving (each silence at most ``drain`` seconds); then cancel it, which keeps its count."""
    if follower is None or task is None:
        return
    if ended:
        follower.job_ended()
        while not task.done():
            seen = follower.received
            await asyncio.wait({task}, timeout=drain)
            if follower.received == seen:
                break
    if not task.done():
        task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        follower.log.warning("Following the log of job %s failed: %s", follower.job.job_id, task.exception())
