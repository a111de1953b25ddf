"""A triggerer that stands still while another takes its trigger over, on the real local cluster over real SSH.

Two triggerers are two threads, each with its own event loop, poller and SSH connection. The first stands still
(its whole loop blocked, as under SIGSTOP) right after a poll cycle fetched new lines of the job's log; the second
starts the same trigger meanwhile, claims the job and resumes the log from the persisted offsets. When the first
runs again, the lines it fetched before the stall belong to the second: every line of the job is written once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid

from npa_airflow.slurm.watch.poller import SlurmPoller, reset_pollers
from tests.harness.airflow_tasks import collecting_logger, submit_deferred, task_context
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.supervisor_double import install_supervisor, run_for_task_instance

LINES = 30
THRESHOLD = 3  # [triggerer] triggerer_health_check_threshold: the least stall before a takeover


def numbers(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("line ")]


def wait_until(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Stall:
    """Blocks one thread's event loop right after a poll cycle's log command returned lines, until released."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.armed = threading.Event()
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.fetched: list[int] = []  # the lines the stalled cycle had fetched

    def install(self, monkeypatch) -> None:
        original = SlurmPoller._tail

        async def tail_then_stall(poller, regs, shredding=()):
            chunks, error = await original(poller, regs, shredding)
            data = b"".join(chunk.data for got in chunks.values() for chunk in got)
            if threading.current_thread() is self.thread and self.armed.is_set() and b"line " in data:
                self.armed.clear()
                self.fetched = numbers(data.decode().splitlines())
                self.stalled.set()
                self.release.wait(120)
            return chunks, error

        monkeypatch.setattr(SlurmPoller, "_tail", tail_then_stall)


def test_lines_fetched_before_a_stall_are_written_once_by_the_triggerer_that_took_over(slurm_cluster, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD", str(THRESHOLD))  # reads good for 1 s
    reset_pollers()
    install_supervisor(monkeypatch, "deferred")
    stall = Stall()
    stall.install(monkeypatch)
    op = make_operator(command=f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.5; done")
    deferred = submit_deferred(op, task_context(f"npa_itest_stall_{uuid.uuid4().hex[:6]}"))
    kwargs = deferred.serialize()[1]
    first, second = (run_for_task_instance(type(deferred)(**kwargs)) for _ in range(2))
    first._log, first_lines = collecting_logger("stalled")
    second._log, second_lines = collecting_logger("took-over")
    done = threading.Event()
    events: list = []

    async def hold() -> None:
        task = asyncio.ensure_future(anext(first.run()))
        while not done.is_set():
            await asyncio.sleep(0.1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await task

    async def take_over() -> None:
        events.append(await asyncio.wait_for(anext(second.run()), 180))

    stall.thread = threading.Thread(target=asyncio.run, args=(hold(),), daemon=True)
    stall.thread.start()
    try:
        wait_until(lambda: len(numbers(first_lines.lines)) >= 4, "the first triggerer to write 4 lines")
        stall.armed.set()
        wait_until(stall.stalled.is_set, "a cycle that fetched lines")
        taker = threading.Thread(target=asyncio.run, args=(take_over(),), daemon=True)
        taker.start()
        stalled_at = time.monotonic()
        wait_until(lambda: len(numbers(second_lines.lines)) >= 3, "the second triggerer to write 3 lines")
        time.sleep(max(0.0, stalled_at + THRESHOLD - time.monotonic()))  # a takeover needs the stall this long
        stall.release.set()
        taker.join(200)
        assert events and events[0].payload["status"] == "success", events
        time.sleep(1)  # the first triggerer's loop has run again by now
    finally:
        stall.release.set()
        done.set()
        stall.thread.join(30)

    assert stall.fetched, "the stalled cycle fetched no lines: the race was not exercised"
    assert first._registration is not None and first._registration.superseded
    wrote_first, wrote_second = numbers(first_lines.lines), numbers(second_lines.lines)
    assert wrote_first + wrote_second == list(range(1, LINES + 1)), (wrote_first, wrote_second, stall.fetched)
