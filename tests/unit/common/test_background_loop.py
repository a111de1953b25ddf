"""run_sync: one private event-loop thread per process runs the sync facades' coroutines."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from npa_airflow.common import background_loop
from npa_airflow.common.background_loop import run_sync


async def _loop_and_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    return asyncio.get_running_loop(), threading.current_thread()


def test_the_coroutine_result_is_returned():
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    assert run_sync(add(2, 3)) == 5


def test_the_coroutine_exception_propagates_to_the_caller():
    class Boom(Exception):
        pass

    async def fail() -> None:
        await asyncio.sleep(0)
        raise Boom("remote side went away")

    with pytest.raises(Boom, match="remote side went away"):
        run_sync(fail())


def test_successive_calls_are_served_by_the_same_loop_thread():
    loop1, thread1 = run_sync(_loop_and_thread())
    loop2, thread2 = run_sync(_loop_and_thread())
    assert loop1 is loop2
    assert thread1 is thread2
    assert thread1 is not threading.current_thread()
    assert thread1.name == "npa-sync-loop" and thread1.daemon


def test_the_loop_still_serves_after_a_call_that_raised():
    async def fail() -> None:
        raise ValueError("x")

    loop_before, _ = run_sync(_loop_and_thread())
    with pytest.raises(ValueError):
        run_sync(fail())
    loop_after, _ = run_sync(_loop_and_thread())
    assert loop_after is loop_before


def test_a_stopped_loop_is_replaced_by_a_fresh_one():
    old_loop, old_thread = run_sync(_loop_and_thread())
    old_loop.call_soon_threadsafe(old_loop.stop)
    old_thread.join(timeout=5)
    assert not old_thread.is_alive() and not old_loop.is_running()

    new_loop, new_thread = run_sync(_loop_and_thread())
    assert new_loop is not old_loop
    assert new_thread is not old_thread and new_thread.is_alive()
    assert run_sync(_loop_and_thread())[0] is new_loop  # and the fresh one is kept
    old_loop.close()


def test_a_loop_recorded_for_another_pid_is_replaced(monkeypatch):
    """What a fork looks like to run_sync: the recorded loop belongs to a pid that is not this process."""
    old_loop, _ = run_sync(_loop_and_thread())
    monkeypatch.setattr(background_loop, "_pid", -1)
    new_loop, _ = run_sync(_loop_and_thread())
    assert new_loop is not old_loop
    assert run_sync(_loop_and_thread())[0] is new_loop
    old_loop.call_soon_threadsafe(old_loop.stop)


def test_calls_from_several_threads_share_the_loop():
    loops: list[asyncio.AbstractEventLoop] = []

    async def slow() -> asyncio.AbstractEventLoop:
        await asyncio.sleep(0.01)
        return asyncio.get_running_loop()

    threads = [threading.Thread(target=lambda: loops.append(run_sync(slow()))) for _ in range(4)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert len(loops) == 4 and len(set(map(id, loops))) == 1
    assert time.monotonic() - start < 5
