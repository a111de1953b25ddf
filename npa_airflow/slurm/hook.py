"""SlurmHook: every byte that goes to or comes from a Slurm login host passes through here.

One async core on asyncssh. Connections are pooled per (event loop, connection identity): a triggerer process holds
one connection per cluster for all of its triggers, and a worker's sync calls share one connection on a private
background loop. Login hosts are tried in order (failover); connecting retries with jittered backoff. Commands that
are not safe to repeat (sbatch) are never retried: a connection lost while they ran is reported as ambiguous.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shlex
import threading
import weakref
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncssh
from airflow.sdk import BaseHook

from npa_airflow.common.remote_errors import sbatch_outcome_unknown, scancel_nothing_to_cancel, squeue_job_id_unknown
from npa_airflow.exceptions import (
    NpaAmbiguousSubmission,
    NpaConnectionError,
    NpaHostKeyError,
    NpaRemoteError,
    NpaValidationError,
)
from npa_airflow.slurm import commands
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.staging import (
    EXIT_MISSING_INPUTS,
    StagedFile,
    build_stage,
    build_stage_and_submit,
    parse_stage_output,
)

T = TypeVar("T")

# Errors that mean "the transport failed", as opposed to "the remote command failed".
_CONNECTION_ERRORS = (OSError, asyncssh.Error, asyncio.TimeoutError, EOFError)
MAX_CHANNELS_PER_CONNECTION = 8

# asyncssh logs every channel and command at INFO; keep task logs readable unless the site chose a level.
if logging.getLogger("asyncssh").level == logging.NOTSET:
    logging.getLogger("asyncssh").setLevel(logging.WARNING)


@dataclass(frozen=True)
class CommandResult:
    stdout: bytes
    stderr: bytes
    returncode: int | None  # None: no exit status arrived ("unknown", never success)
    host: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace").strip()


def backoff_delay(attempt: int, cap: float = 30.0) -> float:
    """Jittered exponential backoff: attempt 1 -> 1-2 s, 2 -> 2-4 s, ... capped."""
    base = min(2 ** (attempt - 1), cap)
    return base + random.uniform(0, base)


class _Pool:
    """Live connections of one event loop, keyed by connection identity."""

    def __init__(self) -> None:
        self.connections: dict[str, tuple[asyncssh.SSHClientConnection, str]] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.channels: dict[str, asyncio.Semaphore] = {}
        self.connects = 0  # how many SSH connections this loop opened (benchmarks and tests read it)


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = _Pool()
    return pool


class _BackgroundLoop:
    """A private event loop thread for the sync facade, so pooled connections outlive single calls."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid: int | None = None

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, T]) -> T:
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid() or not cls._loop.is_running():
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def _serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                threading.Thread(target=_serve, name="npa-slurm-ssh", daemon=True).start()
                started.wait()
                cls._loop, cls._pid = loop, os.getpid()
        return asyncio.run_coroutine_threadsafe(coro, cls._loop).result()


class SlurmHook(BaseHook):
    """Run Slurm commands on a login host over SSH. Connection type ``slurm``; see the README for its fields."""

    conn_name_attr = "slurm_conn_id"
    default_conn_name = "slurm_default"
    conn_type = "slurm"
    hook_name = "Slurm (SSH login host)"

    def __init__(
        self,
        slurm_conn_id: str = default_conn_name,
        *,
        config: SlurmConnectionConfig | None = None,
        connect_attempts: int = 2,
    ) -> None:
        super().__init__()
        self.slurm_conn_id = slurm_conn_id
        self._config = config
        self.connect_attempts = connect_attempts

    # -- configuration -------------------------------------------------------------------------------------------

    @property
    def config(self) -> SlurmConnectionConfig:
        if self._config is None:
            self._config = SlurmConnectionConfig.from_connection(self.get_connection(self.slurm_conn_id))
        return self._config

    async def aconfig(self) -> SlurmConnectionConfig:
        if self._config is None:
            conn = await self.aget_connection(self.slurm_conn_id)
            self._config = SlurmConnectionConfig.from_connection(conn)
        return self._config

    # -- connections -----------------------------------------------------------------------------------------------

    def _connect_options(self, cfg: SlurmConnectionConfig) -> dict[str, Any]:
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
        if cfg.insecure_skip_host_key_check:
            self.log.warning(
                "Host key verification is OFF for slurm connection %r (insecure_skip_host_key_check): "
                "a man-in-the-middle could impersonate the login host.",
                cfg.conn_id,
            )
            options["known_hosts"] = None
        elif cfg.host_key:
            options["known_hosts"] = ([asyncssh.import_public_key(cfg.host_key)], [], [])
        elif cfg.known_hosts:
            if "\n" in cfg.known_hosts.strip() or " " in cfg.known_hosts.strip():
                options["known_hosts"] = asyncssh.import_known_hosts(cfg.known_hosts)
            else:
                options["known_hosts"] = os.path.expanduser(cfg.known_hosts)
        else:
            options["known_hosts"] = os.path.expanduser("~/.ssh/known_hosts")
        return options

    async def _open(self, cfg: SlurmConnectionConfig) -> tuple[asyncssh.SSHClientConnection, str]:
        options = self._connect_options(cfg)
        errors: list[str] = []
        for attempt in range(1, self.connect_attempts + 1):
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
                except _CONNECTION_ERRORS as exc:
                    errors.append(f"{label}: {exc}")
                    nxt = cfg.hosts[index + 1] if index + 1 < len(cfg.hosts) else None
                    if nxt:
                        self.log.warning(
                            "Login host %s unreachable (%s); failing over to %s:%d", label, exc, nxt[0], nxt[1]
                        )
                    continue
                if index > 0:
                    self.log.warning("Connected to fallback login host %s (earlier hosts unreachable)", label)
                _pool().connects += 1
                return conn, label
            if attempt < self.connect_attempts:
                await asyncio.sleep(backoff_delay(attempt))
        raise NpaConnectionError(
            f"no login host of slurm connection {cfg.conn_id!r} could be reached: "
            + "; ".join(errors[-len(cfg.hosts) :])
        )

    async def _connection(self) -> tuple[asyncssh.SSHClientConnection, str, asyncio.Semaphore]:
        cfg = await self.aconfig()
        pool = _pool()
        key = cfg.pool_key
        lock = pool.locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = pool.connections.get(key)
            if entry is None or entry[0].is_closed():
                entry = await self._open(cfg)
                pool.connections[key] = entry
                pool.channels[key] = asyncio.Semaphore(MAX_CHANNELS_PER_CONNECTION)
        return entry[0], entry[1], pool.channels[key]

    async def _drop(self, conn: asyncssh.SSHClientConnection) -> None:
        cfg = await self.aconfig()
        pool = _pool()
        entry = pool.connections.get(cfg.pool_key)
        if entry is not None and entry[0] is conn:
            del pool.connections[cfg.pool_key]
        conn.abort()

    async def aclose(self) -> None:
        """Close this connection identity's pooled connection on the current loop."""
        cfg = await self.aconfig()
        entry = _pool().connections.pop(cfg.pool_key, None)
        if entry is not None:
            entry[0].close()
            await entry[0].wait_closed()

    # -- commands ----------------------------------------------------------------------------------------------------

    async def arun(
        self,
        argv: Sequence[str] | str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = 120,
        check: bool = True,
        idempotent: bool = True,
    ) -> CommandResult:
        """Run one command on the login host. An argv list is quoted with ``shlex.join``.

        A connection that turns out dead before the command ran is replaced once. If it dies while the command
        runs, the command is repeated only when ``idempotent``; otherwise ``NpaConnectionError`` is raised and the
        caller decides (sbatch reconciles by job name).
        """
        command = argv if isinstance(argv, str) else shlex.join(argv)
        if "\x00" in command:  # sshd would cut the command at the NUL (and drop the connection): never send it
            raise NpaValidationError(f"refusing to run a remote command containing a NUL byte: {_short(command)!r}")
        for attempt in (1, 2):
            conn, host, channels = await self._connection()
            started = False
            try:
                async with channels:
                    started = True
                    done = await conn.run(command, input=stdin, encoding=None, timeout=timeout, check=False)
            except asyncssh.TimeoutError as exc:
                raise NpaRemoteError(f"command on {host} timed out after {timeout} s: {_short(command)}") from exc
            except asyncssh.ChannelOpenError as exc:
                await self._drop(conn)
                if attempt == 1:
                    continue
                raise NpaConnectionError(f"could not open a session on {host}: {exc}") from exc
            except _CONNECTION_ERRORS as exc:
                await self._drop(conn)
                if attempt == 1 and (idempotent or not started):
                    continue
                raise NpaConnectionError(f"connection to {host} lost while running {_short(command)}: {exc}") from exc
            result = CommandResult(
                stdout=_as_bytes(done.stdout), stderr=_as_bytes(done.stderr), returncode=done.exit_status, host=host
            )
            if check and result.returncode != 0:
                status = "no exit status" if result.returncode is None else f"exit {result.returncode}"
                raise NpaRemoteError(f"{_short(command)} failed on {host} ({status}): {result.error_text[-2000:]}")
            return result
        raise AssertionError("unreachable")

    async def awrite_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``path`` on the cluster atomically with ``mode``; content travels on stdin only."""
        command, stdin = build_stage([StagedFile(path, data, mode)])
        await self.arun(command, stdin=stdin)

    async def astage(
        self, files: Sequence[StagedFile], *, required_paths: Sequence[str] = (), mkdirs: Sequence[str] = ()
    ) -> None:
        """Check inputs exist, then create dirs and write files, in one round trip."""
        command, stdin = build_stage(files, required_paths=required_paths, mkdirs=mkdirs)
        result = await self.arun(command, stdin=stdin, check=False)
        self._raise_for_stage(result)

    async def asubmit(self, script_path: str, *, sbatch_args: Sequence[str] = ()) -> commands.SubmitResult:
        """``sbatch --parsable`` an already staged script."""
        return await self.astage_and_submit([], script_path, sbatch_args=sbatch_args)

    async def astage_and_submit(
        self,
        files: Sequence[StagedFile],
        script_path: str,
        *,
        sbatch_args: Sequence[str] = (),
        required_paths: Sequence[str] = (),
        mkdirs: Sequence[str] = (),
    ) -> commands.SubmitResult:
        """Check inputs, stage files and submit, all in ONE round trip.

        Raises ``NpaValidationError`` (nothing written) when a required input is missing, ``NpaRemoteError`` when
        sbatch clearly refused the job, and ``NpaAmbiguousSubmission`` when the job may or may not exist.
        """
        cfg = await self.aconfig()
        command, stdin = build_stage_and_submit(
            files,
            script_path,
            sbatch_args=sbatch_args,
            required_paths=required_paths,
            mkdirs=mkdirs,
            cluster=cfg.cluster_name,
        )
        try:
            result = await self.arun(command, stdin=stdin, check=False, idempotent=False, timeout=180)
        except NpaConnectionError as exc:
            raise NpaAmbiguousSubmission(f"connection lost during submission of {script_path}: {exc}") from exc
        except NpaRemoteError as exc:  # timed out: sbatch may have created the job
            raise NpaAmbiguousSubmission(f"submission of {script_path} did not finish: {exc}") from exc
        if result.returncode is None:  # the session ended without a status (e.g. killed after sbatch ran)
            raise NpaAmbiguousSubmission(f"submission of {script_path} on {result.host} ended without an exit status")
        self._raise_for_stage(result)
        outcome = parse_stage_output(result.text)
        if not outcome.sbatch_started:
            raise NpaRemoteError(f"staging for {script_path} failed on {result.host}: {result.error_text[-2000:]}")
        if outcome.sbatch_rc is None:
            raise NpaAmbiguousSubmission(f"sbatch for {script_path} on {result.host} reported no exit status")
        if outcome.sbatch_rc != 0:
            message = result.error_text[-2000:]
            if sbatch_outcome_unknown(message):
                raise NpaAmbiguousSubmission(f"sbatch on {result.host} gave up waiting for slurmctld: {message}")
            raise NpaRemoteError(f"sbatch refused {script_path} on {result.host} (exit {outcome.sbatch_rc}): {message}")
        if not outcome.sbatch_stdout.strip():
            raise NpaAmbiguousSubmission(f"sbatch --parsable printed nothing for {script_path} on {result.host}")
        return commands.parse_sbatch_submit(outcome.sbatch_stdout)

    @staticmethod
    def _raise_for_stage(result: CommandResult) -> None:
        if result.returncode == EXIT_MISSING_INPUTS:
            missing = parse_stage_output(result.text).missing
            raise NpaValidationError(
                "required inputs do not exist on the cluster (checked with test -e from "
                f"{result.host}): {', '.join(missing)}. Stage the data on shared storage (e.g. Lustre) first, "
                "or correct the paths; nothing was written or submitted."
            )
        if result.returncode not in (0, None):
            raise NpaRemoteError(
                f"staging files on {result.host} failed (exit {result.returncode}): {result.error_text[-2000:]}"
            )
        if result.returncode is None:
            raise NpaRemoteError(f"staging files on {result.host} ended without an exit status")

    async def ajob_states(self, job_ids: Sequence[str]) -> dict[str, commands.SlurmJobInfo]:
        """States of many jobs: ONE sacct, plus ONE squeue only for ids accounting does not know yet."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        cfg = await self.aconfig()
        found: dict[str, commands.SlurmJobInfo] = {}
        sacct = await self.arun(commands.build_sacct_states(ids, cfg.cluster_name), check=False)
        if sacct.returncode == 0:
            found.update(commands.parse_sacct(sacct.text))
        missing = [i for i in ids if i not in found]
        if missing:
            squeue = await self.arun(commands.build_squeue_states(missing, cfg.cluster_name), check=False)
            if squeue.returncode == 0:
                found.update(commands.parse_squeue(squeue.text))
            elif squeue_job_id_unknown(squeue.error_text):
                pass  # one id that slurmctld does not know: an answer ("not there"), not a failure
            elif sacct.returncode != 0:
                raise NpaRemoteError(
                    f"neither sacct nor squeue answered on {squeue.host}: "
                    f"sacct: {sacct.error_text[-500:]}; squeue: {squeue.error_text[-500:]}"
                )
        return {i: found[i] for i in ids if i in found}

    async def acancel(self, job_id: str) -> None:
        """``scancel``; a job that already ended (or is unknown to Slurm) counts as cancelled."""
        cfg = await self.aconfig()
        result = await self.arun(commands.build_cancel(job_id, cfg.cluster_name), check=False)
        if result.returncode == 0:
            return
        if scancel_nothing_to_cancel(result.error_text):
            return
        raise NpaRemoteError(
            f"scancel {job_id} failed on {result.host} (exit {result.returncode}): {result.error_text[-1000:]}"
        )

    async def atail_logs(
        self, requests: Sequence[tuple[str, int]], max_bytes: int = 1 << 20
    ) -> list[commands.LogChunk]:
        """New bytes of many files from their offsets, in one round trip."""
        if not requests:
            return []
        result = await self.arun(commands.build_tail_logs(requests, max_bytes), check=True)
        return commands.parse_tail_logs(result.stdout, requests)

    async def atail_log(self, path: str, offset: int, max_bytes: int = 1 << 20) -> tuple[bytes, int]:
        chunk = (await self.atail_logs([(path, offset)], max_bytes))[0]
        return chunk.data, chunk.offset

    async def apaths_exist(self, paths: Sequence[str]) -> dict[str, bool]:
        if not paths:
            return {}
        command, _ = build_stage([], required_paths=paths)
        result = await self.arun(command, check=False)
        if result.returncode not in (0, EXIT_MISSING_INPUTS):
            raise NpaRemoteError(f"checking paths on {result.host} failed: {result.error_text[-1000:]}")
        missing = set(parse_stage_output(result.text).missing)
        return {p: p not in missing for p in paths}

    async def apath_exists(self, path: str) -> bool:
        return (await self.apaths_exist([path]))[path]

    async def afind_jobs_by_name(self, names: Sequence[str]) -> list[commands.SlurmJobInfo]:
        """Jobs whose name is exactly one of ``names``, from squeue (live) and sacct (accounted), merged by id."""
        names = list(dict.fromkeys(names))
        if not names:
            return []
        cfg = await self.aconfig()
        found: dict[str, commands.SlurmJobInfo] = {}
        sacct = await self.arun(commands.build_find_by_name_sacct(names, cfg.cluster_name), check=False)
        if sacct.returncode == 0:
            found.update(commands.parse_sacct(sacct.text))
        squeue = await self.arun(commands.build_find_by_name_squeue(names, cfg.cluster_name), check=False)
        if squeue.returncode == 0:
            found.update(commands.parse_squeue(squeue.text))  # live view wins over accounting lag
        if sacct.returncode != 0 and squeue.returncode != 0:
            raise NpaRemoteError(f"could not look up jobs by name on {squeue.host}: {squeue.error_text[-500:]}")
        wanted = set(names)
        return [info for info in found.values() if info.job_name in wanted]

    async def anodes(self) -> dict[str, Any]:
        result = await self.arun(commands.build_scontrol_nodes())
        return commands.parse_scontrol_nodes(result.text)

    async def apartitions(self) -> dict[str, Any]:
        result = await self.arun(commands.build_partitions())
        return commands.parse_partitions(result.text)

    # -- sync facade (operators run on a worker thread without a loop) -------------------------------------------

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return _BackgroundLoop.run(coro)

    def run(self, argv: Sequence[str] | str, **kwargs: Any) -> CommandResult:
        return self._sync(self.arun(argv, **kwargs))

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self._sync(self.awrite_file(path, data, mode))

    def stage(self, files: Sequence[StagedFile], **kwargs: Any) -> None:
        self._sync(self.astage(files, **kwargs))

    def submit(self, script_path: str, **kwargs: Any) -> commands.SubmitResult:
        return self._sync(self.asubmit(script_path, **kwargs))

    def stage_and_submit(self, files: Sequence[StagedFile], script_path: str, **kwargs: Any) -> commands.SubmitResult:
        return self._sync(self.astage_and_submit(files, script_path, **kwargs))

    def job_states(self, job_ids: Sequence[str]) -> dict[str, commands.SlurmJobInfo]:
        return self._sync(self.ajob_states(job_ids))

    def cancel(self, job_id: str) -> None:
        self._sync(self.acancel(job_id))

    def tail_logs(self, requests: Sequence[tuple[str, int]], max_bytes: int = 1 << 20) -> list[commands.LogChunk]:
        return self._sync(self.atail_logs(requests, max_bytes))

    def tail_log(self, path: str, offset: int, max_bytes: int = 1 << 20) -> tuple[bytes, int]:
        return self._sync(self.atail_log(path, offset, max_bytes))

    def paths_exist(self, paths: Sequence[str]) -> dict[str, bool]:
        return self._sync(self.apaths_exist(paths))

    def path_exists(self, path: str) -> bool:
        return self._sync(self.apath_exists(path))

    def find_jobs_by_name(self, names: Sequence[str]) -> list[commands.SlurmJobInfo]:
        return self._sync(self.afind_jobs_by_name(names))

    def nodes(self) -> dict[str, Any]:
        return self._sync(self.anodes())

    def partitions(self) -> dict[str, Any]:
        return self._sync(self.apartitions())

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button."""
        try:
            result = self.run(["sinfo", "--version"])
        except Exception as exc:
            return False, str(exc)
        return True, f"{result.host}: {result.text.strip()}"


def _as_bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else value.encode()


def _short(command: str, limit: int = 120) -> str:
    first = command.strip().splitlines()[0] if command.strip() else ""
    return first if len(first) <= limit else first[:limit] + "..."
