"""The SSH transport under SlurmHook: pooled asyncssh connections and login host failover.

Connections are pooled per (event loop, connection identity): a triggerer process holds one connection per
cluster for all of its triggers, and a worker's sync calls share one connection on a private background loop
(common/background_loop.py). Login hosts are tried in order (failover); a round over all of them is retried with
the jittered backoff of :mod:`npa_airflow.common.retry`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncssh

from npa_airflow.common.coalesce import Coalescer
from npa_airflow.common.retry import Backoff, Budget, aretry
from npa_airflow.exceptions import NpaConnectionError, NpaHostKeyError
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

T = TypeVar("T")

# Errors that mean "the transport failed", as opposed to "the remote command failed".
CONNECTION_ERRORS = (OSError, asyncssh.Error, asyncio.TimeoutError, EOFError)
MAX_CHANNELS_PER_CONNECTION = 8
# sshd hands the command to the login shell as ONE argument: Linux caps one argument at 128 KiB with its NUL.
MAX_COMMAND_BYTES = 128 * 1024 - 1
# Between rounds over all login hosts: 1-2 s, then 2-4 s, ...
CONNECT_BACKOFF = Backoff(base=1.0, cap=30.0, jitter=1.0)

# asyncssh logs every channel and command at INFO; keep task logs readable unless the site chose a level.
if logging.getLogger("asyncssh").level == logging.NOTSET:
    logging.getLogger("asyncssh").setLevel(logging.WARNING)


@dataclass(frozen=True)
class CommandResult:
    stdout: bytes
    stderr: bytes
    returncode: int | None  # None: no exit status arrived ("unknown", never success)
    host: str
    # The channel was closed for sending before stdin was written: the command never received its input.
    stdin_refused: bool = False

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace").strip()


class ConnectionPool:
    """Live connections of one event loop, keyed by connection identity."""

    def __init__(self) -> None:
        self.connections: dict[str, tuple[asyncssh.SSHClientConnection, str]] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.channels: dict[str, asyncio.Semaphore] = {}
        self.connects = 0  # how many SSH connections this loop opened (benchmarks and tests read it)
        # Whether the login host's squeue has --only-job-state, learnt on the current connection of each key.
        self.only_job_state: dict[str, bool] = {}
        # Whether the cluster keeps accounting (False: sacct said "accounting storage is disabled"), learnt alike.
        self.accounting: dict[str, bool] = {}
        # Read-only commands of every caller on this loop, gathered into one round trip per batch (keyed alike).
        self.reads: dict[str, Coalescer[str, CommandResult]] = {}
        # Lookups of jobs by name, gathered alike into one sacct and one squeue (keyed by connection, cluster, user).
        self.name_lookups: dict[tuple[str, str | None, str], Coalescer[str, list[Any]]] = {}
        # Submissions (stage + sbatch), gathered alike into batches of one session each (keyed by connection).
        self.submissions: dict[str, Coalescer[Any, Any]] = {}


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ConnectionPool] = weakref.WeakKeyDictionary()


def loop_pool() -> ConnectionPool:
    """The connection pool of the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = ConnectionPool()
    return pool


def _known_hosts_option(cfg: SlurmConnectionConfig, log: logging.Logger) -> Any:
    if cfg.insecure_skip_host_key_check:
        log.warning(
            "Host key verification is OFF for slurm connection %r (insecure_skip_host_key_check): "
            "a man-in-the-middle could impersonate the login host.",
            cfg.conn_id,
        )
        return None
    if cfg.host_key:
        return ([asyncssh.import_public_key(cfg.host_key)], [], [])
    if cfg.known_hosts:
        if "\n" in cfg.known_hosts.strip() or " " in cfg.known_hosts.strip():
            return asyncssh.import_known_hosts(cfg.known_hosts)
        return os.path.expanduser(cfg.known_hosts)
    return os.path.expanduser("~/.ssh/known_hosts")


def connect_options(cfg: SlurmConnectionConfig, log: logging.Logger) -> dict[str, Any]:
    """``asyncssh.connect`` keyword arguments for a connection: user, keys, host key policy, keepalive."""
    options: dict[str, Any] = {
        "username": cfg.user,
        "connect_timeout": cfg.connect_timeout,
        "keepalive_interval": 30,
        "keepalive_count_max": 3,
        "agent_path": None,
        "config": None,
    }
    keys = []
    if cfg.private_key:
        keys.append(asyncssh.import_private_key(cfg.private_key, cfg.passphrase))
    if cfg.key_file:
        keys.append(asyncssh.read_private_key(os.path.expanduser(cfg.key_file), cfg.passphrase))
    if keys:
        options["client_keys"] = keys
    options["known_hosts"] = _known_hosts_option(cfg, log)
    return options


class RepeatableConnectionError(NpaConnectionError):
    """The connection died where running the command again is safe (it had not started, or is idempotent)."""


class StdinRefusedConnectionError(NpaConnectionError):
    """The connection died after the remote side had closed stdin unread: the command never got its input."""


class _NoHostReachable(Exception):
    """One round over every login host failed on the transport: worth another round after a backoff."""


async def _connect_to_first_reachable(
    cfg: SlurmConnectionConfig, options: dict[str, Any], errors: list[str], log: logging.Logger
) -> tuple[asyncssh.SSHClientConnection, str]:
    """One round over the login hosts in order; a refused host key or login ends the search at once."""
    for index, (host, port) in enumerate(cfg.hosts):
        label = f"{host}:{port}"
        try:
            conn = await asyncssh.connect(host, port, **options)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise NpaHostKeyError(
                f"login host {label} of slurm connection {cfg.conn_id!r} presented a host key that is not "
                f"trusted ({exc.reason}). If the key changed legitimately, update the connection's "
                "known_hosts/host_key; otherwise do not connect."
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise NpaConnectionError(
                f"login host {label} refused user {cfg.user!r} (permission denied): check the connection's "
                "login, private key and passphrase"
            ) from exc
        except CONNECTION_ERRORS as exc:
            errors.append(f"{label}: {exc}")
            if index + 1 < len(cfg.hosts):
                nxt = cfg.hosts[index + 1]
                log.warning("Login host %s unreachable (%s); failing over to %s:%d", label, exc, nxt[0], nxt[1])
            continue
        if index > 0:
            log.warning("Connected to fallback login host %s (earlier hosts unreachable)", label)
        loop_pool().connects += 1
        return conn, label
    raise _NoHostReachable()


async def open_connection(
    cfg: SlurmConnectionConfig, attempts: int, log: logging.Logger
) -> tuple[asyncssh.SSHClientConnection, str]:
    """A new connection to the first reachable login host, in up to ``attempts`` rounds over all of them."""
    options = connect_options(cfg, log)
    errors: list[str] = []
    try:
        return await aretry(
            lambda: _connect_to_first_reachable(cfg, options, errors, log),
            transient=lambda exc: isinstance(exc, _NoHostReachable),
            backoff=CONNECT_BACKOFF,
            budget=Budget(attempts=attempts),
        )
    except _NoHostReachable:
        raise NpaConnectionError(
            f"no login host of slurm connection {cfg.conn_id!r} could be reached: "
            + "; ".join(errors[-len(cfg.hosts) :])
        ) from None


def as_bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else value.encode()


def groups_below(items: Sequence[T], size: Callable[[T], int], limit: int, most: int | None = None) -> list[list[T]]:
    """``items`` in order, in groups whose sizes add up to at most ``limit`` (a larger item alone) and of at most
    ``most`` items: the commands one batch sends stay below the login host's limit on one argument."""
    groups: list[list[T]] = [[]]
    total = 0
    for item in items:
        cost = size(item)
        if groups[-1] and (total + cost > limit or len(groups[-1]) == most):
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += cost
    return groups


def login_shell_command(script: str) -> str:
    """The command string sent to sshd for ``script``: bash runs it, whatever the user's login shell is.

    sshd runs the command with the login shell (``$SHELL -c``). ``bash -c <shlex.quote(script)>`` is not enough:
    tcsh and csh reject a newline inside single quotes and expand ``!`` even there. So the script travels base64
    encoded (``A-Z a-z 0-9 + / =``, inert inside single quotes in every shell) and bash decodes and evals it; stdin
    is left to the script.
    """
    encoded = base64.b64encode(script.encode()).decode("ascii")
    return f"exec bash -c 'eval \"$(echo {encoded} | base64 -d)\"'"


# A script too long for one argument travels as stdin instead; for commands that take no stdin of their own
# (the poller's and on_kill's batches over 1,000 jobs). Inert in every login shell, like the base64 form.
SCRIPT_ON_STDIN = "exec bash -c 'eval \"$(cat)\"'"


def short_command(command: str, limit: int = 120) -> str:
    """The first line of a command, cut to ``limit`` characters: for messages."""
    first = command.strip().splitlines()[0] if command.strip() else ""
    return first if len(first) <= limit else first[:limit] + "..."
