"""Small checks the validators of names, ids and handles share."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from datetime import timedelta
from typing import Any

from npa_airflow.exceptions import NpaValidationError


def fullmatch_or_raise(value: object, pattern: re.Pattern[str], message: str) -> str:
    """``value`` if it is a string the whole of which matches ``pattern``; else NpaValidationError(message)."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise NpaValidationError(message)
    return value


def field_mismatch(record_type: Any, data: Mapping[str, Any], required: Iterable[str]) -> tuple[list[str], list[str]]:
    """(keys of ``data`` that are not fields of the dataclass ``record_type``, ``required`` keys it lacks)."""
    known = {f.name for f in fields(record_type)}
    return sorted(set(data) - known), [name for name in required if name not in data]


def positive_duration(value: Any, field: str) -> timedelta | None:
    """``value`` (a ``timedelta`` or a number of seconds) as a positive ``timedelta``; None stays None."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise NpaValidationError(
            f"{field}={value!r} must be a positive datetime.timedelta or a positive number of seconds"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)
