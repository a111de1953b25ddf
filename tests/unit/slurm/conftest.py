"""Shared fixtures of the Slurm unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from npa_airflow.slurm import poller as poller_mod
from npa_airflow.slurm.poller import reset_pollers


@pytest.fixture
def fast_poller(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pollers that cycle every 10 ms and stop 0.2 s after their last registration; none left from other tests."""
    monkeypatch.setattr(poller_mod, "FLOOR_SECONDS", 0.01)
    monkeypatch.setattr(poller_mod, "IDLE_STOP_SECONDS", 0.2)
    reset_pollers()
    yield
    reset_pollers()
