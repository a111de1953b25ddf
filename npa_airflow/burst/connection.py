"""The ``skypilot`` connection read into a typed config: the API server's endpoint, its token, the SkyPilot
config overrides sent with each request, the dashboard URL template and the user requests are made as.

Connection fields: host = endpoint (``http://127.0.0.1:26580``; a port on the connection is appended; a host
without a scheme means https), extra ``token`` (service-account Bearer token; the password field works too),
``config_overrides`` (object merged into each request's SkyPilot config), ``dashboard_url_template``, ``user``
(the name requests are made as; default ``airflow``).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from npa_airflow.exceptions import NpaValidationError

log = logging.getLogger(__name__)

_warned_cleartext: set[str] = set()


def warn_cleartext(conn_id: str, endpoint: str, hostname: str) -> None:
    """Once per process and endpoint: an http:// endpoint off this machine sends the token in clear."""
    if endpoint in _warned_cleartext or _is_loopback(hostname):
        return
    _warned_cleartext.add(endpoint)
    log.warning(
        "SkyPilot connection %s uses %s over plain http: its token and the launches' secrets (registry "
        "credentials) travel in clear. Use https:// (a host without a scheme means https).",
        *(conn_id, endpoint),
    )


def _is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


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
                "e.g. http://127.0.0.1:26580"
            )
        if "://" not in host:  # plain http only when written: the token and the launch's secrets travel in clear
            host = f"{'http' if conn.schema == 'http' else 'https'}://{host}"
        parts = urlsplit(host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise NpaValidationError(f"connection {conn_id!r}: host={conn.host!r} is not an http(s) endpoint")
        endpoint = host.rstrip("/")
        if conn.port and parts.port is None:
            endpoint = f"{parts.scheme}://{parts.netloc}:{conn.port}{parts.path}".rstrip("/")
        if parts.scheme == "http":
            warn_cleartext(conn_id, endpoint, parts.hostname)
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
