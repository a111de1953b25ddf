"""The job log follower (burst/joblog.py) and what SkyPilot's /logs stream carries (burst/client/joblog.py).

The real API server is in tests/skypilot/test_burst_log_resume.py; here a scripted stream stands in for it, to
pin the line rules (partial lines, the server's own lines, the trailer) and the count's guard.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from npa_airflow.burst import joblog
from npa_airflow.burst.client.joblog import LineKind, LogStreamParser, classify_log_line
from npa_airflow.burst.joblog import JobLog, JobLogFollower, MemoryLineCount, line_count_value, parse_line_count

TRAILER = "\x1b[0m\x1b[32m✓ Job finished (status: SUCCEEDED).\x1b[0m\x1b[0m"
HEARTBEAT = '<sky-payload>"<heartbeat></heartbeat>"</sky-payload>'
JOB = JobLog("npa-c", 3)
MARK = "Waiting for task resources on 1 node.\n"  # SkyPilot's first line of every job log


def test_lines_end_at_newline_crlf_or_a_lone_cr_across_pieces():
    parser = LogStreamParser(from_start=False)

    def texts(lines):
        return [line.text for line in lines]

    assert texts(parser.feed("ab")) == []
    assert texts(parser.feed("c\nd\r")) == ["abc"]
    assert texts(parser.feed("\ne\rf\n\ng")) == ["d", "e", "f", ""]
    assert texts(parser.finish()) == []  # a partial line is not a line
    parser.feed("h\r")
    assert texts(parser.finish()) == ["h"]  # a lone \r at the end did end its line


@pytest.mark.parametrize(
    "raw, kind, text",
    [
        ("tick 3 of 9", LineKind.JOB, "tick 3 of 9"),
        ("", LineKind.JOB, ""),
        (HEARTBEAT, LineKind.CONTROL, ""),
        ("INFO: Waiting 1s for the logs to be written...", LineKind.NOTE, None),
        (
            "\x1b[31mERROR: Logs for job 3 (status: PENDING) does not exist after retrying 5 times.\x1b[0m",
            LineKind.NOTE,
            None,
        ),
        (TRAILER, LineKind.END, ""),
        ("last words" + TRAILER, LineKind.END, "last words"),
    ],
)
def test_job_lines_are_told_from_the_servers_own(raw, kind, text):
    line = classify_log_line(raw)
    assert line.kind is kind
    if text is not None:
        assert line.text == text
    if kind is LineKind.END:
        assert line.status == "SUCCEEDED"


def test_what_the_server_says_before_the_jobs_log_starts_is_not_counted():
    parser = LogStreamParser()
    lines = parser.feed("I 12-03 sky/backend.py] checking the cluster\n" + MARK + "t1\n")
    assert [line.kind for line in lines] == [LineKind.NOTE, LineKind.JOB, LineKind.JOB]
    assert LogStreamParser(from_start=False).feed("t9\n")[0].kind is LineKind.JOB


def test_the_count_is_kept_for_one_try_and_job():
    value = line_count_value(2, JOB, 41)
    assert parse_line_count(value) == (2, JOB, 41)
    assert parse_line_count("2 npa-c x 41") is None and parse_line_count(None) is None


class ScriptedLog:
    """Stand-in for the hook's log stream: each open plays the next script (pieces of text, or an exception)."""

    def __init__(self, *opens: list) -> None:
        self.opens = list(opens)
        self.opened = 0

    async def astream_job_log(self, cluster, job_id):
        self.opened += 1
        for piece in self.opens.pop(0) if self.opens else []:
            if isinstance(piece, Exception):
                raise piece
            yield piece

    async def ajob_log_end(self, cluster, job_id):
        return "1\n" + TRAILER + "\n"


class Written(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def written():
    log = logging.getLogger("test.joblog")
    handler = Written()
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    yield log, handler.lines
    log.removeHandler(handler)


def ticks(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("t")]


async def test_a_broken_stream_is_reopened_and_resumes_after_the_lines_written(written, monkeypatch):
    monkeypatch.setattr(joblog, "REOPEN_BACKOFF", joblog.Backoff(base=0.0, cap=0.0))
    log, lines = written
    source = ScriptedLog(
        [MARK + "t1\nt2\n", "t3\nt4 par", ConnectionError("server gone")],  # the partial t4 is not written
        [HEARTBEAT + "\n", MARK + "t1\nt2\nt3\nt4 partial\n"],  # ended early: no trailer
        ["INFO: Waiting 1s for the logs to be written...\n", MARK + "t1\nt2\nt3\nt4 partial\nt5\n" + TRAILER + "\n"],
    )
    count = MemoryLineCount()
    await JobLogFollower(source, JOB, log, count).run()
    assert ticks(lines) == ["t1", "t2", "t3", "t4 partial", "t5"]
    assert source.opened == 3 and count.kept[JOB] == 6  # with SkyPilot's first line


async def test_a_restart_resumes_from_the_kept_count(written):
    log, lines = written
    count = MemoryLineCount()
    await count.save(JOB, 3)
    await JobLogFollower(ScriptedLog([MARK + "t1\nt2\nt3\n" + TRAILER + "\n"]), JOB, log, count).run()
    assert ticks(lines) == ["t3"] and count.kept[JOB] == 4


async def test_a_last_line_without_newline_comes_from_the_finished_logs_end(written):
    log, lines = written

    class NoNewline(ScriptedLog):
        async def ajob_log_end(self, cluster, job_id):
            return "t2 no newline" + TRAILER + "\n"

    await JobLogFollower(NoNewline([MARK + "t1\n" + TRAILER + "\n"]), JOB, log).run()
    assert ticks(lines) == ["t1", "t2 no newline"]


async def test_after_the_jobs_end_one_clean_read_to_the_end_completes_the_log(written):
    log, lines = written
    follower = JobLogFollower(ScriptedLog([MARK + "t1\n"]), JOB, log)
    follower.job_ended()
    await asyncio.wait_for(follower.run(), 5)
    assert ticks(lines) == ["t1"]


class HandedOver(MemoryLineCount):
    """Another trigger claims the job once ``after`` lines were written."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.follower: JobLogFollower | None = None

    async def owned(self) -> bool:
        return self.follower is None or self.follower.lines < self.after


async def test_a_superseded_follower_writes_no_more_lines_and_keeps_no_count(written, monkeypatch):
    monkeypatch.setattr(joblog, "CLAIM_FRESH_SECONDS", 0.0)  # ask before every line
    log, lines = written
    count = HandedOver(after=3)
    await count.save(JOB, 0)
    follower = JobLogFollower(ScriptedLog([MARK + "t1\nt2\nt3\nt4\n" + TRAILER + "\n"]), JOB, log, count)
    count.follower = follower
    await follower.run()
    assert ticks(lines) == ["t1", "t2"]
    assert count.kept[JOB] <= 3  # never more than it wrote; the new holder's count is not overwritten after


class SlowCount(MemoryLineCount):
    """A count whose saves take ``latency`` seconds; it records when each save began and what it kept."""

    def __init__(self, latency: float) -> None:
        super().__init__()
        self.latency = latency
        self.saves: list[tuple[float, int]] = []

    async def save(self, job, lines):
        self.saves.append((time.monotonic(), lines))
        await asyncio.sleep(self.latency)
        return await super().save(job, lines)


async def test_a_line_a_spacing_after_the_last_save_began_is_saved_at_once(written):
    """The count trails the log as little as it can: the save spacing counts from a save's start, so a save's
    own latency does not push the next one later (which let the count trail by up to a spacing)."""
    log, _ = written
    count = SlowCount(latency=0.5 * joblog.SAVE_SPACING_SECONDS)
    second_line_at: list[float] = []

    class Paced(ScriptedLog):
        async def astream_job_log(self, cluster, job_id):
            yield MARK + "t1\n"
            while not any(lines >= 2 for _, lines in count.saves):  # t1 (and SkyPilot's first line) saved
                await asyncio.sleep(0.01)
            await asyncio.sleep(joblog.SAVE_SPACING_SECONDS + 0.1 - (time.monotonic() - count.saves[-1][0]))
            second_line_at.append(time.monotonic())
            yield "t2\n"
            await asyncio.sleep(joblog.SAVE_SPACING_SECONDS)  # still following: no final save yet
            yield TRAILER + "\n"

    await asyncio.wait_for(JobLogFollower(Paced(), JOB, log, count).run(), 10)
    started = next(at for at, lines in count.saves if lines >= 3)
    assert started - second_line_at[0] < 0.25 * joblog.SAVE_SPACING_SECONDS, (started, second_line_at, count.saves)
