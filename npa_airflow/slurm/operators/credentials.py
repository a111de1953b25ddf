"""Credentials the cluster side needs, never written into a script, a log, XCom or a template field.

- `secret_env` of `SlurmSubmitOperator`: {ENV_NAME: "var:NAME" | "conn:CONN_ID[:field]"}: checked at parse time
  (`validate_secret_env`), resolved on the worker (`resolve_secret_env`) into the mode-600 sidecar the job sources.
- `SlurmEnrootCredentialsOperator`: installs registry credentials in Enroot's credentials file (mode 600) from
  an Airflow connection; the secret travels on SSH stdin only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators.job import fail_task

if TYPE_CHECKING:
    from airflow.sdk import Context


def resolve_secret_env(secret_env: Mapping[str, str]) -> dict[str, str]:
    """Resolve {ENV_NAME: "var:NAME" | "conn:CONN_ID[:password|login|extra_key]"} at execute time."""
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


class SlurmEnrootCredentialsOperator(BaseOperator):
    """Install registry credentials for Enroot/Pyxis on the cluster, once per cluster and user.

    Reads the registry connection (host = registry, e.g. ``nvcr.io``; login, e.g. ``$oauthtoken``; password,
    e.g. the NGC API key) and writes netrc lines into ``~/.config/enroot/.credentials`` (for ``nvcr.io`` also
    ``authn.nvidia.com``) in a block of its own, mode 600, atomically. The secret goes over SSH stdin: never on
    a command line, in a log, in XCom or in a template field.
    """

    ui_color = "#f4ece8"

    def __init__(self, *, registry_conn_id: str, slurm_conn_id: str = "slurm_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not re.match(r"^[A-Za-z0-9_.-]{1,200}$", registry_conn_id or ""):
            raise NpaValidationError(f"registry_conn_id={registry_conn_id!r} is not a connection id")
        self.registry_conn_id = registry_conn_id
        self.slurm_conn_id = slurm_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk import BaseHook

        from npa_airflow.slurm.enroot import (
            CREDENTIALS_MARK,
            NGC_AUTH_HOST,
            NGC_REGISTRY,
            build_credentials_block,
            build_install_credentials_command,
        )
        from npa_airflow.slurm.hook import SlurmHook

        conn = BaseHook.get_connection(self.registry_conn_id)
        registry = (conn.host or "").strip()
        block = build_credentials_block(registry, conn.login or "", conn.password or "", key=self.registry_conn_id)
        hook = SlurmHook(self.slurm_conn_id)
        result = hook.run(build_install_credentials_command(self.registry_conn_id), stdin=block, check=False)
        del block
        line = next((ln for ln in result.text.splitlines() if ln.startswith(CREDENTIALS_MARK + " ")), "")
        if result.returncode != 0 or not line:
            raise fail_task(
                f"could not install Enroot credentials for {registry} on {result.host} (exit {result.returncode}): "
                f"{result.error_text[-500:]}"
            )
        _, path, mode = line.split(" ", 2)
        hosts = [registry] + ([NGC_AUTH_HOST] if registry.split(":")[0] == NGC_REGISTRY else [])
        self.log.info("Installed Enroot credentials for %s in %s (mode %s) on %s", hosts, path, mode, result.host)
        return {"path": path, "mode": mode, "machines": hosts}
