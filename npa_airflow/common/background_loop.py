"""One private event-loop thread per process that runs the sync facades' coroutines.

The sync hooks (SSH and the SkyPilot HTTP client) are thin faces over async cores. Running every call on the
same long-lived loop lets pooled SSH connections and HTTP clients outlive single calls; a fork (a new pid) or a
stopped loop gets a fresh one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# Re-entrant: an operator's on_kill runs inside Airflow's SIGTERM handler, on the main thread, possibly while that
# thread is in run_sync below; its own run_sync must not deadlock on the lock the interrupted call holds.
_lock = threading.RLock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None


def _serve(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    loop.run_forever()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or not _loop.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()
            threading.Thread(target=_serve, args=(loop, started), name="npa-sync-loop", daemon=True).start()
            started.wait()
            _loop, _pid = loop, os.getpid()
        return _loop


_targets = threading.local()  # a thread's own choice of loop for run_sync (calls_on)


@contextlib.contextmanager
def calls_on(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Within the block, this thread's run_sync runs its coroutines on `loop`, another thread's running loop: the
    triggerer's start threads then share that loop's SSH connections with its poller instead of opening more."""
    previous = getattr(_targets, "loop", None)
    _targets.loop = loop
    try:
        yield
    finally:
        _targets.loop = previous


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop (or the loop of `calls_on`) and wait for its result (from a thread
    without a running loop)."""
    loop = getattr(_targets, "loop", None)
    if loop is None or not loop.is_running():
        loop = _background_loop()
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def spawn(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on the background loop without waiting: work that must not hold the caller's thread (the
    API server's request threads) and bounds its own time."""
    return asyncio.run_coroutine_threadsafe(coro, _background_loop())
