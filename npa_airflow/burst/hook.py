"""SkyPilotHook: the ``skypilot`` connection (an API server endpoint) and clients for it.

Connection fields: host = endpoint (``http://127.0.0.1:46580``; a port on the connection is appended),
extra ``token`` (service-account Bearer token; the password field works too), ``config_overrides``
(object merged into each request's SkyPilot config), ``dashboard_url_template``, ``user`` (the name
requests are made as; default ``airflow``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow.sdk.bases.hook import BaseHook

from npa_airflow.exceptions import NpaValidationError

if TYPE_CHECKING:
    from npa_airflow.burst.client import AsyncSkyPilotClient, SkyPilotClient


@dataclass(frozen=True)
class SkyPilotConnectionConfig:
    endpoint: str
    token: str | None = field(default=None, repr=False)
    config_overrides: dict[str, Any] = field(default_factory=dict)
    dashboard_url_template: str | None = None
    user: str = "airflow"

    @classmethod
    def from_connection(cls, conn: Any) -> SkyPilotConnectionConfig:
        conn_id = getattr(conn, "conn_id", "?")
        host = (conn.host or "").strip()
        if not host:
            raise NpaValidationError(
                f"connection {conn_id!r}: host is empty; set it to the SkyPilot API server endpoint, "
                "e.g. http://127.0.0.1:46580"
            )
        if "://" not in host:
            host = f"{conn.schema if conn.schema in ('http', 'https') else 'http'}://{host}"
        parts = urlsplit(host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise NpaValidationError(f"connection {conn_id!r}: host={conn.host!r} is not an http(s) endpoint")
        endpoint = host.rstrip("/")
        if conn.port and parts.port is None:
            endpoint = f"{parts.scheme}://{parts.netloc}:{conn.port}{parts.path}".rstrip("/")
        extra = conn.extra_dejson or {}
        overrides = extra.get("config_overrides") or {}
        if isinstance(overrides, str):
            try:
                overrides = json.loads(overrides) if overrides.strip() else {}
            except ValueError as exc:
                raise NpaValidationError(f"connection {conn_id!r}: config_overrides is not JSON ({exc})") from exc
        if not isinstance(overrides, dict):
            raise NpaValidationError(f"connection {conn_id!r}: config_overrides must be a JSON object")
        user = str(extra.get("user") or "airflow")
        return cls(
            endpoint=endpoint,
            token=extra.get("token") or conn.password or None,
            config_overrides=overrides,
            dashboard_url_template=extra.get("dashboard_url_template") or None,
            user=user,
        )


class SkyPilotHook(BaseHook):
    """Talks to a SkyPilot API server over HTTP. Connection type ``skypilot``."""

    conn_name_attr = "skypilot_conn_id"
    default_conn_name = "skypilot_default"
    conn_type = "skypilot"
    hook_name = "SkyPilot API server"

    def __init__(self, skypilot_conn_id: str = default_conn_name, *, config: SkyPilotConnectionConfig | None = None):
        super().__init__()
        self.skypilot_conn_id = skypilot_conn_id
        self._config = config

    @property
    def config(self) -> SkyPilotConnectionConfig:
        if self._config is None:
            self._config = SkyPilotConnectionConfig.from_connection(self.get_connection(self.skypilot_conn_id))
        return self._config

    async def aconfig(self) -> SkyPilotConnectionConfig:
        if self._config is None:
            conn = await self.aget_connection(self.skypilot_conn_id)
            self._config = SkyPilotConnectionConfig.from_connection(conn)
        return self._config

    @staticmethod
    def _identity(config: SkyPilotConnectionConfig):
        from npa_airflow.burst.client import Identity

        return Identity(user=config.user, config_overrides=config.config_overrides)

    def get_client(self) -> SkyPilotClient:
        from npa_airflow.burst.client import SkyPilotClient

        config = self.config
        return SkyPilotClient(config.endpoint, token=config.token, identity=self._identity(config))

    async def aget_client(self) -> AsyncSkyPilotClient:
        from npa_airflow.burst.client import AsyncSkyPilotClient

        config = await self.aconfig()
        return AsyncSkyPilotClient(config.endpoint, token=config.token, identity=self._identity(config))

    def test_connection(self) -> tuple[bool, str]:
        try:
            with self.get_client() as client:
                info = client.health()
        except Exception as exc:
            return False, str(exc)
        return True, f"SkyPilot API server {info.version} (API version {info.api_version}) is healthy"
