"""`secret_env`: where each session credential of a job lives, and its value when the job needs it.

{ENV_NAME: "var:NAME" | "conn:CONN_ID[:password|login|host|schema|extra_key]"} names an Airflow Variable or a
connection field, never the value. It is checked at DAG parse time (`validate_secret_env`) and resolved
(`resolve_secret_env`) on the worker. A Slurm job gets the values in the mode-600 sidecar it sources, and every
process that writes the job's output (the triggerer, the completing worker) resolves them again to register them
with its secrets masker; the references travel in the trigger's kwargs, the values never do. A Burst job gets
them as SkyPilot secrets.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping

from npa_airflow.common.secret_masking import amask_values, mask_values
from npa_airflow.exceptions import NpaValidationError


def resolve_secret_env(secret_env: Mapping[str, str]) -> dict[str, str]:
    """Resolve {ENV_NAME: "var:NAME" | "conn:CONN_ID[:password|login|extra_key]"} at execute time."""
    # DAG parse: BaseHook (airflow.sdk.bases.hook) loads only when a secret is resolved
    from airflow.sdk import BaseHook, Variable

    values: dict[str, str] = {}
    for name, source in secret_env.items():
        kind, _, ref = source.partition(":")
        if kind == "var":
            values[name] = str(Variable.get(ref))
        elif kind == "conn":
            conn_id, _, attr = ref.partition(":")
            conn = BaseHook.get_connection(conn_id)
            attr = attr or "password"
            if attr in ("password", "login", "host", "schema"):
                value = getattr(conn, attr)
            else:
                value = conn.extra_dejson.get(attr)
            if value in (None, ""):
                raise NpaValidationError(f"secret_env[{name!r}]: connection {conn_id!r} has no {attr!r}")
            values[name] = str(value)
    return values


def validate_secret_env(secret_env: Mapping[str, str] | None) -> dict[str, str]:
    """The references checked (DAG parse time, trigger rows); raise NpaValidationError naming the bad entry."""
    if not secret_env:
        return {}
    if not isinstance(secret_env, Mapping):
        raise NpaValidationError(f"secret_env={secret_env!r} must map ENV_NAME -> 'var:NAME' or 'conn:CONN_ID[:field]'")
    out = {}
    for name, source in secret_env.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise NpaValidationError(f"secret_env key {name!r} is not an environment variable name")
        if not isinstance(source, str) or not re.fullmatch(
            r"(var:[A-Za-z0-9_.-]+|conn:[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?)", source
        ):
            raise NpaValidationError(
                f"secret_env[{name!r}]={source!r}: name where the secret lives, as 'var:VARIABLE_NAME' or "
                "'conn:CONNECTION_ID[:password|login|extra_key]' (never the secret itself)"
            )
        out[name] = source
    return out


def mask_secret_env(secret_env: Mapping[str, str], resolved: Iterable[str] | None = None) -> None:
    """Register the values (resolved now unless given) with this process's secrets masker; raises when they
    cannot be read."""
    mask_values(resolved if resolved is not None else resolve_secret_env(secret_env).values())


async def amask_secret_env(secret_env: Mapping[str, str], resolved: Iterable[str] | None = None) -> None:
    """`mask_secret_env` from a coroutine (Variable.get and get_connection block: they run in a thread)."""
    if resolved is None:
        resolved = (await asyncio.to_thread(resolve_secret_env, secret_env)).values()
    await amask_values(resolved)
