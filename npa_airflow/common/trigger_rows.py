"""How this provider's triggers describe themselves for Airflow's trigger table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class RowValue(Protocol):
    """A value a trigger holds typed (a job handle) and its row keeps as a dict."""

    def to_dict(self) -> dict[str, Any]: ...


def as_trigger_row(trigger: object, kwarg_names: Iterable[str]) -> tuple[str, dict[str, Any]]:
    """(classpath, kwargs) as ``BaseTrigger.serialize`` returns them: the constructor's arguments by name.

    The classpath is the trigger's own class, so a subclass (the conversion trigger) round-trips as itself. A job
    handle is stored as its ``to_dict()``, the dict the constructor takes (and earlier releases stored).
    """
    cls = type(trigger)
    kwargs = {name: getattr(trigger, name) for name in kwarg_names}
    return f"{cls.__module__}.{cls.__qualname__}", {
        name: value.to_dict() if isinstance(value, RowValue) else value for name, value in kwargs.items()
    }
