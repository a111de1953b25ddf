"""The one retry policy: delays, budgets, and which errors are retried."""

from __future__ import annotations

import asyncio

import pytest

from npa_airflow.common import retry as r


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_up_to_the_cap_with_jitter_above_the_plain_delay():
    b = r.Backoff(base=1.0, cap=8.0, jitter=0.5)
    assert [b.plain(n) for n in range(0, 6)] == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]
    for n in range(1, 8):
        for _ in range(50):
            assert b.plain(n) <= b.delay(n) <= b.plain(n) * 1.5


def test_jitter_spreads_clients_that_failed_together():
    delays = {round(r.Backoff(base=1.0, cap=30.0).delay(3), 6) for _ in range(20)}
    assert len(delays) > 10


def test_attempt_budget_counts_failures():
    budget = r.Budget(attempts=3)
    assert budget.allows(0.0)
    assert budget.allows(0.0)
    assert not budget.allows(0.0)


def test_time_budget_refuses_a_delay_that_would_end_past_it():
    clock = Clock()
    budget = r.Budget(seconds=10.0, clock=clock)
    assert budget.allows(9.0)
    clock.now = 5.0
    assert not budget.allows(6.0)
    assert budget.allows(5.0)


def test_retry_returns_after_transient_failures(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(r, "pause", slept.append)
    answers = iter([OSError("reset"), OSError("reset"), "ok"])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    seen: list[str] = []
    result = r.retry(
        call,
        transient=lambda exc: isinstance(exc, OSError),
        backoff=r.Backoff(base=1.0, cap=4.0, jitter=0.0),
        budget=r.Budget(attempts=5),
        on_retry=lambda exc, delay: seen.append(f"{exc} {delay}"),
    )
    assert result == "ok"
    assert slept == [1.0, 2.0]
    assert seen == ["reset 1.0", "reset 2.0"]


def test_retry_raises_at_once_what_is_not_transient(monkeypatch):
    monkeypatch.setattr(r, "pause", lambda s: pytest.fail("must not sleep"))
    calls = []

    def call():
        calls.append(1)
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        r.retry(call, transient=lambda exc: isinstance(exc, OSError), backoff=r.Backoff(), budget=r.Budget())
    assert len(calls) == 1


def test_retry_raises_the_last_error_when_the_budget_is_spent(monkeypatch):
    monkeypatch.setattr(r, "pause", lambda s: None)
    count = iter(range(100))

    def call():
        raise OSError(f"down {next(count)}")

    with pytest.raises(OSError, match="down 2"):
        r.retry(call, transient=lambda exc: True, backoff=r.Backoff(), budget=r.Budget(attempts=3))


def test_aretry_follows_the_same_policy(monkeypatch):
    slept: list[float] = []

    async def fake_pause(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(r, "apause", fake_pause)
    answers = iter([ConnectionError("x"), 7])

    async def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = asyncio.run(
        r.aretry(call, transient=lambda e: True, backoff=r.Backoff(base=2.0, jitter=0.0), budget=r.Budget(attempts=4))
    )
    assert result == 7
    assert slept == [2.0]
