"""Coalescer: requests that arrive together share one call; nobody waits forever."""

from __future__ import annotations

import asyncio

import pytest

from npa_airflow.common.coalesce import Coalescer


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
