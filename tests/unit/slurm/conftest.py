"""Shared fixtures of the Slurm unit tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from npa_airflow.slurm.watch import poller as poller_mod
from npa_airflow.slurm.watch.poller import reset_pollers


@pytest.fixture
async def fast_poller(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Pollers that cycle every 10 ms and stop 0.2 s after their last registration; none left from other tests.

    At the end the test's pollers are stopped while their loop still runs: cancelling one at the loop's close
    can land inside `create_subprocess_exec`, which then never finishes (Python 3.11's subprocess transport).
    """
    monkeypatch.setattr(poller_mod, "FLOOR_SECONDS", 0.01)
    monkeypatch.setattr(poller_mod, "IDLE_STOP_SECONDS", 0.2)
    reset_pollers()
    yield
    monkeypatch.setattr(poller_mod, "IDLE_STOP_SECONDS", 0.0)
    for poller in poller_mod._POLLERS.on_running_loop():
        poller._registrations.clear()  # the loop ends by itself once idle, between two commands
        poller._wake.set()
        if poller._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(poller._task), 5)
    reset_pollers()
