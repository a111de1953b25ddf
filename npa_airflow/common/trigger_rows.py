"""How this provider's triggers describe themselves for Airflow's trigger table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def as_trigger_row(trigger: object, kwarg_names: Iterable[str]) -> tuple[str, dict[str, Any]]:
    """(classpath, kwargs) as ``BaseTrigger.serialize`` returns them: the constructor's arguments by name.

    The classpath is the trigger's own class, so a subclass (the conversion trigger) round-trips as itself.
    """
    cls = type(trigger)
    return f"{cls.__module__}.{cls.__qualname__}", {name: getattr(trigger, name) for name in kwarg_names}
