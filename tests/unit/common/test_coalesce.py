"""Coalescer: requests that arrive together share one call; nobody waits forever. InFlight: threads that ask
while the same read runs share it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from npa_airflow.common.coalesce import Coalescer, InFlight


class Source:
    """Answers {key: key * 10}; `gate` holds a call open, `fail` makes the next call raise."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def fetch(self, keys: list[int]) -> dict[int, int]:
        self.calls.append(sorted(keys))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            exc, self.fail = self.fail, None
            raise exc
        return {k: k * 10 for k in keys if k >= 0}


async def test_requests_that_arrive_together_share_one_call():
    source = Source()
    reads = Coalescer(source.fetch, gather=0.01)
    answers = await asyncio.gather(*(reads.get(k) for k in [3, 1, 2, 1]))
    assert answers == [30, 10, 20, 10]
    assert source.calls == [[1, 2, 3]] and reads.calls == 1


async def test_requests_during_a_call_go_into_the_next_one_and_a_missing_answer_is_none():
    source = Source()
    source.gate = asyncio.Event()
    reads = Coalescer(source.fetch, gather=0.0)
    first = asyncio.ensure_future(reads.get(1))
    await asyncio.sleep(0.01)  # the first call is running
    later = [asyncio.ensure_future(reads.get(k)) for k in (2, -1)]
    await asyncio.sleep(0.01)
    source.gate.set()
    assert await first == 10
    assert [await t for t in later] == [20, None]
    assert source.calls == [[1], [-1, 2]]


async def test_with_two_concurrent_calls_a_held_call_leaves_the_other_to_serve_the_rest():
    """A batch of submissions stuck on a slow login-host session must not hold every other one: with
    concurrent=2 a second call serves what arrives meanwhile, and a third waits for either to end."""
    held = asyncio.Event()

    async def fetch(keys: list[int]) -> dict[int, int]:
        calls.append(sorted(keys))
        if 1 in keys:
            await held.wait()
        return {k: k * 10 for k in keys}

    calls: list[list[int]] = []
    reads = Coalescer(fetch, gather=0.0, concurrent=2)
    stuck = asyncio.ensure_future(reads.get(1))
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(reads.get(2), 1) == 20  # served beside the held call
    together = [asyncio.ensure_future(reads.get(k)) for k in (3, 4)]
    assert [await asyncio.wait_for(t, 1) for t in together] == [30, 40]
    held.set()
    assert await stuck == 10
    assert calls == [[1], [2], [3, 4]]
    assert sum(1 for r in reads._runners if not r.done()) == 0


async def test_a_failed_call_raises_in_each_of_its_callers_only():
    source = Source()
    reads = Coalescer(source.fetch, gather=0.01)
    source.fail = ConnectionError("login host down")
    results = await asyncio.gather(reads.get(1), reads.get(2), return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    assert await reads.get(3) == 30  # the next batch is asked afresh


async def test_a_caller_that_gives_up_leaves_the_others_their_answer():
    source = Source()
    source.gate = asyncio.Event()
    reads = Coalescer(source.fetch, gather=0.0)
    impatient = asyncio.ensure_future(asyncio.wait_for(reads.get(1), 0.01))
    patient = asyncio.ensure_future(reads.get(2))
    with pytest.raises(asyncio.TimeoutError):
        await impatient
    source.gate.set()
    assert await patient == 20


async def test_the_runner_does_not_inherit_the_first_callers_context():
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="fresh")
    seen = []

    async def fetch(keys):
        seen.append(var.get())
        return dict.fromkeys(keys, 1)

    var.set("trigger 1's log context")
    assert await Coalescer(fetch, gather=0.0).get("k") == 1
    assert seen == ["fresh"]


def _threads_get(shared: InFlight, key: str, read, count: int) -> list:
    """`count` threads call shared.get(key, read) at once; their answers (or exceptions), in order."""
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(shared.get, key, read) for _ in range(count)]
        return [f.exception() or f.result() for f in futures]


def test_threads_asking_while_a_read_runs_share_it_each_with_its_own_copy():
    shared: InFlight[str, list] = InFlight()
    started, release = threading.Event(), threading.Event()

    def slow_read() -> list:
        started.set()
        release.wait(5)
        return [{"command": "echo 1"}]

    first = concurrent.futures.ThreadPoolExecutor(1).submit(shared.get, "up", slow_read)
    started.wait(5)
    with concurrent.futures.ThreadPoolExecutor(7) as pool:
        joiners = [pool.submit(shared.get, "up", slow_read) for _ in range(7)]
        time.sleep(0.2)  # all seven wait on the running read
        release.set()
        answers = [first.result(5)] + [j.result(5) for j in joiners]
    assert shared.reads == 1
    assert all(answer == [{"command": "echo 1"}] for answer in answers)
    assert len({id(answer) for answer in answers}) == 8  # a start that changes its value changes no other's
    assert shared.get("up", lambda: ["later"]) == ["later"] and shared.reads == 2  # nothing kept after a read
    assert shared.get("other", lambda: ["b"]) == ["b"] and shared.reads == 3


def test_a_failed_read_raises_in_the_threads_that_shared_it_and_the_next_reads_again():
    shared: InFlight[str, int] = InFlight()

    def failing() -> int:
        time.sleep(0.3)
        raise ConnectionError("supervisor gone")

    answers = _threads_get(shared, "up", failing, 4)
    assert all(isinstance(a, ConnectionError) for a in answers)
    assert shared.reads < 4  # they shared
    assert shared.get("up", lambda: 7) == 7
