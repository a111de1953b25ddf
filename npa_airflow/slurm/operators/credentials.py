"""Credentials the cluster side needs, never written into a script, a log, XCom or a template field.

- `secret_env` of `SlurmSubmitOperator`: {ENV_NAME: "var:NAME" | "conn:CONN_ID[:field]"}: checked at parse time
  and resolved on the worker into the mode-600 sidecar the job sources (`npa_airflow.slurm.secret_env`).
- `SlurmEnrootCredentialsOperator`: installs registry credentials in Enroot's credentials file (mode 600) from
  an Airflow connection; the secret travels on SSH stdin only.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from npa_airflow.common.secret_env import resolve_secret_env, validate_secret_env
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators.job import fail_task

__all__ = ["SlurmEnrootCredentialsOperator", "resolve_secret_env", "validate_secret_env"]

if TYPE_CHECKING:
    from airflow.sdk import Context


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
        # DAG parse: BaseHook, the enroot builders and the hook (asyncssh) load only when the task runs
        from airflow.sdk import BaseHook

        from npa_airflow.slurm.hook import SlurmHook
        from npa_airflow.slurm.submit.enroot import (
            CREDENTIALS_MARK,
            NGC_AUTH_HOST,
            NGC_REGISTRY,
            build_credentials_block,
            build_install_credentials_command,
        )

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
