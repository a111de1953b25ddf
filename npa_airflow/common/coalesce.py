"""Requests that arrive together, answered by one call.

When a DAG run with 1,000 waiting tasks is marked failed, the triggerer cancels 1,000 triggers at once and
each one's on_kill reads its task instance, its job's claim and state, then cancels the job. Asked one by
one that is thousands of SSH commands and database reads; through a :class:`Coalescer` the keys that arrive
within a short gathering pause, or while the previous call is still running, go into one call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import threading
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

GATHER_SECONDS = 0.05  # a lone request waits this long for company; under load the running call gathers more


class Coalescer(Generic[K, V]):
    """``await get(key)`` -> ``fetch([keys...])[key]`` (None when the answer lacks it), one fetch per batch.

    A failed fetch raises its exception in every caller of that batch. At most ``concurrent`` fetches run at
    once (one by default: fetches never overlap); keys that arrive while that many run wait for one of them to
    end and go into the next batch. Each runner starts in a fresh context, so it does not inherit the first
    caller's context (a trigger's task-log routing).
    """

    def __init__(
        self,
        fetch: Callable[[list[K]], Awaitable[Mapping[K, V]]],
        gather: float = GATHER_SECONDS,
        *,
        concurrent: int = 1,
    ) -> None:
        self._fetch = fetch
        self._gather = gather
        self._concurrent = concurrent
        self._waiting: dict[K, list[asyncio.Future[V | None]]] = {}
        self._runners: set[asyncio.Task[None]] = set()
        self._fetching = 0
        self.calls = 0  # fetches made (tests prove the coalescing by it)

    async def get(self, key: K) -> V | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[V | None] = loop.create_future()
        self._waiting.setdefault(key, []).append(future)
        running = sum(1 for runner in self._runners if not runner.done())  # a done one may not be discarded yet
        if running - self._fetching <= 0 and running < self._concurrent:  # no runner will take the key: start one
            runner = contextvars.Context().run(loop.create_task, self._drain())
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        return await future

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(self._gather)
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                self.calls += 1
                self._fetching += 1
                try:
                    answers = await self._fetch(list(batch))
                except Exception as exc:
                    for futures in batch.values():
                        _settle(futures, exc=exc)
                    continue
                except BaseException:  # cancelled mid-fetch
                    _cancel(batch)
                    raise
                finally:
                    self._fetching -= 1
                for key, futures in batch.items():
                    _settle(futures, value=answers.get(key))
        except BaseException:  # the loop is shutting down: nobody may wait forever
            waiting, self._waiting = self._waiting, {}
            _cancel(waiting)
            raise


def _cancel(batch: Mapping[K, list[asyncio.Future[V | None]]]) -> None:
    for futures in batch.values():
        for future in futures:
            future.cancel()


def _settle(futures: list[asyncio.Future[V | None]], value: V | None = None, exc: BaseException | None = None) -> None:
    for future in futures:
        if future.done():  # its caller gave up (cancelled, timed out)
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)


class InFlight(Generic[K, V]):
    """``get(key, read)`` from many threads: a call made while the same key's read runs waits for that read and
    gets a deep copy of its answer (or its exception) instead of reading again. Nothing is kept after a read
    ends, so no answer is older than a read that was running when its caller asked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[K, concurrent.futures.Future[V]] = {}
        self.reads = 0  # reads made (tests prove the sharing by it)

    def get(self, key: K, read: Callable[[], V]) -> V:
        with self._lock:
            running = self._running.get(key)
            if running is None:
                running = self._running[key] = concurrent.futures.Future()
                self.reads += 1
                mine = True
            else:
                mine = False
        if not mine:
            return copy.deepcopy(running.result())
        try:
            running.set_result(read())
        except BaseException as exc:
            running.set_exception(exc)
        finally:
            with self._lock:
                del self._running[key]
        return running.result()
