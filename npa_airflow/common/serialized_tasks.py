"""The real operator of a task that starts in the triggerer (`start_from_trigger`), rebuilt from the serialized DAG.

The triggerer has no DAG file: it holds the task as the scheduler does, a serialized operator that keeps Airflow's
fields and the template fields, not the operator's own ones. So the operator records its own constructor arguments
as one serialized field, `npa_init_kwargs` (a JSON string: a dict-valued field breaks the DAG's deserialization in
Airflow 3.3.2), and the trigger builds the operator again from it. A mapped task keeps its `partial()` arguments in
the serialized DAG already; its `expand()` values are literal lists or the XCom of an unmapped upstream task.

A task whose arguments hold something a JSON document cannot carry (an XComArg of an unmapped task, a callable) has
no `npa_init_kwargs`: its trigger hands the start to a worker, which has the DAG file.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

INIT_KWARGS_FIELD = "npa_init_kwargs"
# What the rebuilt operator takes from Airflow's own fields of the serialized task.
AIRFLOW_FIELDS = ("execution_timeout", "retries")


class NotRebuildable(Exception):
    """The task cannot be rebuilt in the triggerer; the message says why (the worker starts it instead)."""


@functools.cache
def own_parameters(cls: type) -> dict[str, Any]:
    """The constructor parameters `cls` and its bases below Airflow's BaseOperator declare: {name: default}."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, BaseOperator) or klass is BaseOperator or "__init__" not in vars(klass):
            continue
        for name, param in inspect.signature(klass.__init__).parameters.items():
            if name != "self" and param.kind is param.KEYWORD_ONLY:
                found[name] = param.default
    return found


def _is_plain(value: Any) -> bool:
    """JSON-like data (what a trigger can rebuild from), or a timedelta (Airflow's serialization carries it)."""
    if value is None or isinstance(value, (str, int, float, bool, timedelta)):
        return True
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return False


def init_kwargs_json(op: BaseOperator) -> str | None:
    """The operator's own constructor arguments as given (defaults left out), serialized; None when one of them is
    not plain data."""
    # DAG parse: the serializer is loaded only where DAGs are serialized (the dag-processor)
    from airflow.serialization.serialized_objects import BaseSerialization

    given = getattr(op, "_BaseOperator__init_kwargs", {})
    kwargs = {k: v for k, v in given.items() if k in own_parameters(type(op))}
    if not _is_plain(kwargs):
        return None
    return json.dumps(BaseSerialization.serialize(kwargs), sort_keys=True)


def task_class(task: Any) -> type:
    """The operator class the serialized `task` was made from."""
    module, name = getattr(task, "_task_module", None), getattr(task, "task_type", None)
    if not module or not name:
        raise NotRebuildable("the serialized task names no operator class")
    cls = getattr(importlib.import_module(module), name, None)
    if not isinstance(cls, type) or not issubclass(cls, BaseOperator):
        raise NotRebuildable(f"{module}.{name} is not an operator class")
    return cls


def operator_kwargs(task: Any, cls: type, xcom: Any, map_index: int | None) -> dict[str, Any]:
    """The arguments to build `cls` with for this task instance; `xcom(task_id, key)` reads an upstream's XCom."""
    # run-time only: the triggerer
    from airflow.serialization.serialized_objects import BaseSerialization

    own = own_parameters(cls)
    if getattr(task, "is_mapped", False):
        partial = getattr(task, "partial_kwargs", None) or {}
        kwargs = {k: v for k, v in partial.items() if k in own}
        if not _is_plain(kwargs):
            raise NotRebuildable("its partial() arguments hold values other than plain data")
        kwargs.update(expanded_values(task, xcom, map_index))
    else:
        raw = getattr(task, INIT_KWARGS_FIELD, None)
        if not isinstance(raw, str):
            raise NotRebuildable("its arguments hold values other than plain data (an XComArg, an object)")
        kwargs = BaseSerialization.deserialize(json.loads(raw))
    for name in AIRFLOW_FIELDS:
        value = getattr(task, name, None)
        if value is not None and name not in kwargs:
            kwargs[name] = value
    return kwargs


def _xcom_ref(value: Any) -> tuple[str, str] | None:
    """(task id, key) of an XCom reference in a serialized expand() input, else None."""
    data = getattr(value, "data", None)  # _XComRef
    if isinstance(data, Mapping) and "task_id" in data:
        return str(data["task_id"]), str(data.get("key") or "return_value")
    operator = getattr(value, "operator", None)  # a deserialized XComArg
    if operator is not None and getattr(value, "key", None) is not None:
        if getattr(operator, "is_mapped", False):
            raise NotRebuildable(f"it expands over the output of the mapped task {operator.task_id}")
        return str(operator.task_id), str(value.key)
    return None


def expanded_values(task: Any, xcom: Any, map_index: int | None) -> dict[str, Any]:
    """This map index's values of a mapped task's expand() arguments (Airflow's order: the last one varies
    fastest)."""
    expand_input = getattr(task, "expand_input", None)
    mapping = getattr(expand_input, "value", None)
    if not isinstance(mapping, Mapping) or map_index is None or map_index < 0:
        raise NotRebuildable("it is mapped with expand_kwargs() or over something other than expand()'s lists")
    values: dict[str, Sequence[Any]] = {}
    for name, value in mapping.items():
        ref = _xcom_ref(value)
        resolved = xcom(*ref) if ref is not None else value
        if isinstance(resolved, Mapping):
            resolved = list(resolved.items())
        if not isinstance(resolved, (list, tuple)):
            raise NotRebuildable(f"its expand() argument {name!r} is not a list")
        values[name] = resolved
    out: dict[str, Any] = {}
    index = map_index
    for name in reversed(list(values)):
        length = len(values[name])
        if length < 1:
            raise NotRebuildable(f"its expand() argument {name!r} is empty")
        out[name] = values[name][index % length]
        index //= length
    if not _is_plain(out):
        raise NotRebuildable("its expand() values are not plain data")
    return out
