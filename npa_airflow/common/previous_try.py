"""What a new try does with what its earlier tries left running (`on_previous_try`), for both backends.

A try first looks for the jobs (Slurm) or launches (Burst) of the task instance's earlier tries by their names.
"reattach" adopts the newest live one and waits for it instead of starting anew; any older live ones are
duplicates and cancelled. "cancel" cancels every live one, then starts anew. Each backend finds the live ones,
applies `on_previous_try` and carries out its answer (slurm/operators/submission.py, burst/tries.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from npa_airflow.exceptions import NpaValidationError

ON_PREVIOUS_TRY = ("reattach", "cancel")
T = TypeVar("T")


@dataclass(frozen=True)
class PreviousTries(Generic[T]):
    """`adopt`: the earlier try's live job to wait for (None: start anew); `cancel`: the live ones to cancel."""

    adopt: T | None
    cancel: tuple[T, ...] = ()


def on_previous_try(mode: str, live: Sequence[T]) -> PreviousTries[T]:
    """The rule: `live` are the earlier tries' live jobs, oldest first; `mode` is "reattach" or "cancel"."""
    if live and mode == "reattach":
        return PreviousTries(live[-1], tuple(live[:-1]))
    return PreviousTries(None, tuple(live))


def checked_mode(mode: str, what: str, start: str) -> str:
    """`mode` if it is one of ON_PREVIOUS_TRY, else an error that says what the backend adopts (`what`, e.g. "job")
    and how it starts anew (`start`, e.g. "submitting")."""
    if mode not in ON_PREVIOUS_TRY:
        raise NpaValidationError(
            f"on_previous_try={mode!r} must be one of {ON_PREVIOUS_TRY} "
            f"(adopt the earlier try's live {what}, or cancel it before {start} a new one)"
        )
    return mode
