"""One state vocabulary for every backend (the seed's: PENDING, RUNNING, COMPLETE, ERROR, CANCELED, UNKNOWN)."""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    ERROR = "ERROR"
    CANCELED = "CANCELED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.COMPLETE, JobState.ERROR, JobState.CANCELED)

    @property
    def is_success(self) -> bool:
        return self is JobState.COMPLETE
