"""Cluster calls of a running task that ride out a short slurmctld/sshd outage: retried with jittered backoff while
the cluster does not answer (`exceptions.cluster_did_not_answer`), for a bounded time, then raised."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from npa_airflow.common.retry import Backoff, Budget, retry
from npa_airflow.exceptions import cluster_did_not_answer

OUTAGE_RETRY_SECONDS = 90.0  # cluster calls of a running task ride out a short slurmctld/sshd outage
OUTAGE_BACKOFF = Backoff(base=2.0, cap=15.0, jitter=0.5)
# Airflow's supervisor sends SIGKILL 5 s after the SIGTERM whose handler calls on_kill: cancel within that.
ON_KILL_SECONDS = 4.0
ON_KILL_BACKOFF = Backoff(base=0.5, cap=2.0, jitter=0.5)
T = TypeVar("T")


def through_outage(
    log: logging.Logger,
    what: str,
    call: Callable[[], T],
    *,
    seconds: float | None = None,
    backoff: Backoff = OUTAGE_BACKOFF,
) -> T:
    """Retry `call` while the cluster does not answer, for `seconds` (default OUTAGE_RETRY_SECONDS)."""
    return retry(
        call,
        transient=cluster_did_not_answer,
        backoff=backoff,
        budget=Budget(seconds=OUTAGE_RETRY_SECONDS if seconds is None else seconds),
        on_retry=lambda exc, delay: log.warning("%s failed (%s); retrying in %.0f s", what, exc, delay),
    )


def cluster_read(log: logging.Logger, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a read-only hook call through a short outage (better than burning a retry)."""
    return through_outage(log, what, lambda: call(*args, **kwargs))
