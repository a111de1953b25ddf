"""The one retry policy: jittered exponential backoff inside a time or attempt budget.

Every loop that waits before asking a remote side again (SSH connect and run, the pre-submit cluster reads,
the Slurm poller, the SkyPilot transport, the Burst watch and teardown) takes its delays from a
:class:`Backoff` and sleeps only through :func:`pause` / :func:`apause`, so the schedule is tuned in one place.

``tenacity`` (an Airflow dependency) is not used: half of these loops are not "call until no exception" (the
poller backs off on consecutive failed cycles, the preflight retries on a report, the watch on a streak of API
errors), and one delay schedule with one sleep serves all of them more simply than wrapping each in a
``Retrying`` object.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delay before attempt ``n + 1`` after ``n`` failures: ``base * 2**(n-1)`` capped, times ``1..1+jitter``.

    Jitter spreads many clients that failed together (every trigger of a triggerer after an sshd restart).
    """

    base: float = 1.0
    cap: float = 30.0
    jitter: float = 1.0

    def delay(self, failures: int) -> float:
        if failures < 1:
            return 0.0
        plain = min(self.base * 2 ** min(failures - 1, 30), self.cap)
        return plain * random.uniform(1.0, 1.0 + self.jitter)

    def plain(self, failures: int) -> float:
        """The delay without jitter: for messages and for tests."""
        return 0.0 if failures < 1 else min(self.base * 2 ** min(failures - 1, 30), self.cap)


@dataclass
class Budget:
    """How long (monotonic seconds) or how many attempts a retry loop may spend; ``None`` is unbounded."""

    seconds: float | None = None
    attempts: int | None = None
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    failures: int = 0

    def __post_init__(self) -> None:
        self.started = self.clock()

    def allows(self, delay: float) -> bool:
        """Record one more failure; True if another attempt after ``delay`` seconds stays within the budget."""
        self.failures += 1
        if self.attempts is not None and self.failures >= self.attempts:
            return False
        return self.seconds is None or self.clock() - self.started + delay <= self.seconds


def pause(seconds: float) -> None:
    """The sync side's only backoff sleep."""
    if seconds > 0:
        time.sleep(seconds)


async def apause(seconds: float, wake: asyncio.Event | None = None) -> None:
    """The async side's only backoff sleep; with ``wake``, it ends as soon as that event is set."""
    if seconds <= 0:
        return
    if wake is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(wake.wait(), seconds)


Transient = Callable[[BaseException], bool]
OnRetry = Callable[[BaseException, float], None]


def _delay_or_raise(
    exc: BaseException, transient: Transient, backoff: Backoff, budget: Budget, on_retry: OnRetry | None
) -> float:
    delay = backoff.delay(budget.failures + 1)
    if not transient(exc) or not budget.allows(delay):
        raise exc
    if on_retry is not None:
        on_retry(exc, delay)
    return delay


def retry(
    call: Callable[[], T], *, transient: Transient, backoff: Backoff, budget: Budget, on_retry: OnRetry | None = None
) -> T:
    """Call until it returns; re-raise at once what is not transient, and the last error when the budget is spent."""
    while True:
        try:
            return call()
        except Exception as exc:
            pause(_delay_or_raise(exc, transient, backoff, budget, on_retry))


async def aretry(
    call: Callable[[], Awaitable[T]],
    *,
    transient: Transient,
    backoff: Backoff,
    budget: Budget,
    on_retry: OnRetry | None = None,
) -> T:
    """The async twin of :func:`retry` (same policy, ``asyncio.sleep``)."""
    while True:
        try:
            return await call()
        except Exception as exc:
            await apause(_delay_or_raise(exc, transient, backoff, budget, on_retry))
