"""Parse an Airflow ``slurm`` connection into a validated, immutable config (pure: no I/O but file checks)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.handle import CLUSTER_RE

DEFAULT_SSH_PORT = 22
DEFAULT_CONNECT_TIMEOUT = 15.0


def _opt_str(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise NpaValidationError(f"slurm connection extra {key!r} must be a string, got {type(value).__name__}")
    return value.strip() or None


def _opt_bool(extra: Mapping[str, Any], key: str) -> bool:
    value = extra.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no", ""):
        return value.strip().lower() in ("true", "1", "yes")
    raise NpaValidationError(f"slurm connection extra {key!r} must be true or false, got {value!r}")


def _abs_path_or_none(extra: Mapping[str, Any], key: str) -> str | None:
    value = _opt_str(extra, key)
    if value is not None and not value.startswith("/"):
        raise NpaValidationError(
            f"slurm connection extra {key!r} must be an absolute path on the cluster's shared storage, got {value!r}"
        )
    if value is not None and ("\n" in value or "\0" in value):
        raise NpaValidationError(f"slurm connection extra {key!r} contains a newline or NUL byte")
    return value


def parse_login_hosts(host_field: str | None, default_port: int) -> tuple[tuple[str, int], ...]:
    """``"a,b:2223"`` -> ``(("a", default_port), ("b", 2223))``; order is the failover order."""
    if not host_field or not host_field.strip():
        raise NpaValidationError("slurm connection has no login host: set Host to one host or a comma-separated list")
    hosts: list[tuple[str, int]] = []
    for raw in host_field.split(","):
        item = raw.strip()
        if not item:
            continue
        name, port = item, default_port
        if item.startswith("["):  # [ipv6]:port
            close = item.find("]")
            name, rest = item[1:close], item[close + 1 :]
            if rest.startswith(":"):
                port = _parse_port(rest[1:], item)
        elif item.count(":") == 1:
            name, port_text = item.split(":")
            port = _parse_port(port_text, item)
        if not name or any(c.isspace() or c in "'\"`$;&|<>\\" for c in name):
            raise NpaValidationError(f"slurm connection login host {item!r} is not a valid host name")
        hosts.append((name, port))
    if not hosts:
        raise NpaValidationError("slurm connection has no login host: set Host to one host or a comma-separated list")
    return tuple(hosts)


def _parse_port(text: str, item: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise NpaValidationError(f"slurm connection login host {item!r} has an invalid port {text!r}")
    return int(text)


@dataclass(frozen=True)
class SlurmConnectionConfig:
    """Everything a SlurmHook needs from its Airflow connection. Secrets are excluded from ``repr``."""

    conn_id: str
    hosts: tuple[tuple[str, int], ...]
    user: str
    private_key: str | None = field(default=None, repr=False)
    key_file: str | None = None
    passphrase: str | None = field(default=None, repr=False)
    known_hosts: str | None = None  # path, or known_hosts content
    host_key: str | None = None  # one public key line trusted for every login host
    insecure_skip_host_key_check: bool = False
    partition: str | None = None
    account: str | None = None
    results_root: str | None = None
    cpu_partition: str | None = None
    sqsh_cache_dir: str | None = None
    cluster_name: str | None = None  # -M on every Slurm command; None = the login host's default cluster
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    job_url_template: str | None = None

    @classmethod
    def from_connection(cls, conn: Any) -> SlurmConnectionConfig:
        """Build from an Airflow ``Connection`` (anything with host/port/login/password/extra_dejson)."""
        extra = dict(getattr(conn, "extra_dejson", None) or {})
        port = int(conn.port) if conn.port else DEFAULT_SSH_PORT
        user = (conn.login or "").strip()
        if not user:
            raise NpaValidationError(f"slurm connection {conn.conn_id!r} has no login (the cluster user)")
        timeout = extra.get("connect_timeout")
        cfg = cls(
            conn_id=conn.conn_id,
            hosts=parse_login_hosts(conn.host, port),
            user=user,
            private_key=_opt_str(extra, "private_key"),
            key_file=_opt_str(extra, "key_file"),
            passphrase=conn.password or None,
            known_hosts=_opt_str(extra, "known_hosts"),
            host_key=_opt_str(extra, "host_key"),
            insecure_skip_host_key_check=_opt_bool(extra, "insecure_skip_host_key_check"),
            partition=_opt_str(extra, "partition"),
            account=_opt_str(extra, "account"),
            results_root=_abs_path_or_none(extra, "results_root"),
            cpu_partition=_opt_str(extra, "cpu_partition"),
            sqsh_cache_dir=_abs_path_or_none(extra, "sqsh_cache_dir"),
            cluster_name=_opt_str(extra, "cluster_name"),
            connect_timeout=float(timeout) if timeout not in (None, "") else DEFAULT_CONNECT_TIMEOUT,
            job_url_template=_opt_str(extra, "job_url_template"),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not self.insecure_skip_host_key_check and not (self.known_hosts or self.host_key):
            if not os.path.exists(os.path.expanduser("~/.ssh/known_hosts")):
                raise NpaValidationError(
                    f"slurm connection {self.conn_id!r} has no known_hosts or host_key and host key verification is "
                    "on: add the login host's key (ssh-keyscan -p PORT HOST) as extra 'known_hosts' or 'host_key', "
                    "or set 'insecure_skip_host_key_check': true explicitly"
                )
        if self.key_file and not os.path.exists(os.path.expanduser(self.key_file)):
            raise NpaValidationError(
                f"slurm connection {self.conn_id!r}: key_file {self.key_file!r} does not exist on this machine"
            )
        if self.cluster_name is not None and not CLUSTER_RE.fullmatch(self.cluster_name):
            raise NpaValidationError(
                f"slurm connection {self.conn_id!r}: extra 'cluster_name'={self.cluster_name!r} is not one Slurm "
                "cluster name ([A-Za-z0-9_.-], as `sacctmgr list clusters` shows it); one connection names one cluster"
            )
        if self.connect_timeout <= 0:
            raise NpaValidationError(f"slurm connection {self.conn_id!r}: connect_timeout must be positive")

    @property
    def pool_key(self) -> str:
        """Identifies connections that may be shared: same hosts, user, credentials and trust."""
        material = repr(
            (
                self.hosts,
                self.user,
                self.private_key,
                self.key_file,
                self.passphrase,
                self.known_hosts,
                self.host_key,
                self.insecure_skip_host_key_check,
                self.connect_timeout,
            )
        )
        return hashlib.sha256(material.encode()).hexdigest()[:16]
