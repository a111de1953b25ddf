"""Renamed operator arguments: one vocabulary for Slurm and Burst, the old names still accepted.

Both backends say ``command``, ``environment``, ``secret_env`` and ``max_wait``. Burst's old names
``entrypoint``, ``envs``, ``secret_conn_ids`` and ``deadline`` keep working, with a ``DeprecationWarning`` that
points at the line of the DAG file and names the new argument. ``gpus_per_node`` (Slurm: a GPU count) and
``accelerators`` (Burst: a SkyPilot accelerator spec ``NAME:COUNT`` per node) are different things and keep
different names; Burst's ``gpu_per_node`` is the old name of ``accelerators``.

An operator keeps each old name in its signature, defaulting to None: Airflow applies ``default_args`` and checks
``partial()``/``expand()`` keywords against the signature, so DAGs that pass an old name either way keep working.
It then calls ``renamed()`` once per pair, which also settles a name given both ways.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

from npa_airflow.exceptions import NpaValidationError

# old name -> new name, per backend (README: "Renamed arguments").
BURST_RENAMED: Mapping[str, str] = {
    "entrypoint": "command",
    "envs": "environment",
    "secret_conn_ids": "secret_env",
    "deadline": "max_wait",
    "gpu_per_node": "accelerators",
}

_INTERNAL_PACKAGES = ("npa_airflow", "airflow")


def renamed(
    owner: str,
    new: str,
    new_value: Any,
    old: str,
    old_value: Any,
    default_args: Mapping[str, Any] | None = None,
) -> Any:
    """The value of argument ``new`` given as ``new`` or as its old name ``old`` (None: not given).

    The old name warns (``DeprecationWarning``, pointing at the DAG file). Both given is an error, except that a
    value the task passes itself wins over one that came from ``default_args`` (as Airflow does for any
    argument); both from ``default_args`` (one DAG's defaults for Slurm and Burst tasks alike): the old name, which
    is what this operator read before.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        defaults = default_args or {}
        new_default = new in defaults and defaults[new] is new_value
        old_default = old in defaults and defaults[old] is old_value
        if not new_default and not old_default:
            raise NpaValidationError(
                f"{owner}: both {new}= and {old}= given. {old} is the old name of {new}: pass only {new}="
            )
        if old_default and not new_default:
            return new_value  # the task says the new name; the old one only came from default_args
    warnings.warn(
        f"{owner}: {old}= is deprecated, use {new}= (same meaning)",
        DeprecationWarning,
        stacklevel=_outside_stacklevel(),
    )
    return old_value


def _outside_stacklevel() -> int:
    """The ``stacklevel`` (for a ``warnings.warn`` in the caller of this function's caller) of the first frame
    outside npa_airflow and Airflow: the DAG file's line that built the operator."""
    level = 2
    frame = sys._getframe(2)
    while frame is not None and _is_internal(frame.f_globals.get("__name__") or ""):
        frame = frame.f_back
        level += 1
    return level


def _is_internal(module: str) -> bool:
    return any(module == pkg or module.startswith(pkg + ".") for pkg in _INTERNAL_PACKAGES)


def require(owner: str, name: str, value: Any) -> Any:
    """``value`` of a required argument that now has a default (its old name may stand in for it)."""
    if value is None:
        raise TypeError(f"{owner}: missing keyword argument {name!r}")
    return value
