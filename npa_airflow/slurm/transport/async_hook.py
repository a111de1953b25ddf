"""The async core of SlurmHook: every Slurm command a trigger or an operator runs on a login host.

Commands that are not safe to repeat (sbatch) are never retried: a connection lost while they ran is reported as
ambiguous. The sync methods operators call live in :mod:`npa_airflow.slurm.hook`; the transport in
:mod:`npa_airflow.slurm.transport.ssh`.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import asyncssh

from npa_airflow.common.coalesce import Coalescer
from npa_airflow.common.configured_hook import ConfiguredHook
from npa_airflow.common.retry import Backoff, Budget, aretry
from npa_airflow.exceptions import NpaConnectionError, NpaRemoteError, NpaValidationError
from npa_airflow.slurm import commands
from npa_airflow.slurm.submit.staging import EXIT_MISSING_INPUTS, build_stage, parse_stage_output
from npa_airflow.slurm.transport.accounting_mode import AccountingMode
from npa_airflow.slurm.transport.cancels import CancelCommands
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from npa_airflow.slurm.transport.job_queries import JobQueries
from npa_airflow.slurm.transport.ssh import (
    CONNECTION_ERRORS,
    MAX_CHANNELS_PER_CONNECTION,
    MAX_COMMAND_BYTES,
    SCRIPT_ON_STDIN,
    CommandResult,
    RepeatableConnectionError,
    StdinRefusedConnectionError,
    as_bytes,
    groups_below,
    login_shell_command,
    loop_pool,
    open_connection,
    short_command,
)
from npa_airflow.slurm.transport.submit_commands import SubmitCommands

# A command whose connection died is run once more on a new connection, at once.
RERUN_BACKOFF = Backoff(base=0.0, cap=0.0, jitter=0.0)
RUN_ATTEMPTS = 2
# A shared read batch is one command: it is split well below MAX_COMMAND_BYTES (the frame around each command,
# and the login shell's quoting, add to it).
READ_BATCH_BYTES = MAX_COMMAND_BYTES // 2
BATCH_FRAME_BYTES = 200
H = TypeVar("H", bound="AsyncSlurmHook")


def _feed(process: asyncssh.SSHClientProcess[bytes], stdin: bytes | None) -> bool:
    """Write ``stdin`` and EOF; True when the channel was already closed for sending (the command had exited)."""
    try:
        if stdin:
            process.stdin.write(stdin)
        process.stdin.write_eof()  # always: a command that reads stdin must never wait for more
    except BrokenPipeError:  # asyncssh: "Channel not open for sending"
        return True
    return False


class AsyncSlurmHook(ConfiguredHook[SlurmConnectionConfig], CancelCommands, AccountingMode, JobQueries, SubmitCommands):
    """The async Slurm commands over SSH; :class:`npa_airflow.slurm.hook.SlurmHook` adds the sync facade.

    Every Slurm command names one cluster with ``-M``: ``cluster`` when given (the cluster a job handle
    records), else the connection's ``cluster_name``; neither means the login host's default cluster (no -M).
    The cancels (checked, by id or by a try's job name) come from :class:`.cancels.CancelCommands`, the job
    states and lookups from :class:`.job_queries.JobQueries`, staging and sbatch from
    :class:`.submit_commands.SubmitCommands`, and what a cluster without accounting needs from
    :class:`.accounting_mode.AccountingMode` (all in ``npa_airflow/slurm/transport/``).
    """

    conn_name_attr = "slurm_conn_id"
    config_type = SlurmConnectionConfig

    def __init__(
        self,
        slurm_conn_id: str = "slurm_default",
        *,
        config: SlurmConnectionConfig | None = None,
        connect_attempts: int = 2,
        cluster: str | None = None,
    ) -> None:
        super().__init__()
        self.slurm_conn_id = slurm_conn_id
        self._config = config
        self.connect_attempts = connect_attempts
        self.cluster = None if cluster is None else commands.validate_cluster(cluster)

    def on_cluster(self: H, cluster: str | None) -> H:
        """This hook for the jobs of `cluster` (a handle's): same connection, -M `cluster` on Slurm commands.

        None (sbatch printed no cluster: the job went to the default) keeps this hook as it is.
        """
        if cluster is None or cluster == self.cluster:
            return self
        return type(self)(
            self.slurm_conn_id, config=self._config, connect_attempts=self.connect_attempts, cluster=cluster
        )

    async def atarget_cluster(self) -> str | None:
        """The cluster this hook's Slurm commands name (see the class docstring); None = no -M."""
        return self.cluster or (await self.aconfig()).cluster_name

    # -- connections ---------------------------------------------------------------------------------------------

    async def _connection(self) -> tuple[asyncssh.SSHClientConnection, str, asyncio.Semaphore]:
        cfg = await self.aconfig()
        pool = loop_pool()
        key = cfg.pool_key
        lock = pool.locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = pool.connections.get(key)
            if entry is None or entry[0].is_closed():
                entry = await open_connection(cfg, self.connect_attempts, self.log)
                pool.connections[key] = entry
                pool.only_job_state.pop(key, None)  # another login host may run another squeue
                pool.accounting.pop(key, None)
                pool.channels[key] = asyncio.Semaphore(MAX_CHANNELS_PER_CONNECTION)
        return entry[0], entry[1], pool.channels[key]

    async def _drop(self, conn: asyncssh.SSHClientConnection) -> None:
        cfg = await self.aconfig()
        pool = loop_pool()
        entry = pool.connections.get(cfg.pool_key)
        if entry is not None and entry[0] is conn:
            del pool.connections[cfg.pool_key]
        conn.abort()

    async def aclose(self) -> None:
        """Close this connection identity's pooled connection on the current loop."""
        cfg = await self.aconfig()
        entry = loop_pool().connections.pop(cfg.pool_key, None)
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
        """Run one command on the login host, always under bash (:func:`login_shell_command`).

        An argv list is quoted with ``shlex.join``; a string must be built only from quoted parts. Either becomes a
        bash script, so the user's login shell (tcsh, zsh, ...) never parses it. A script too long for one
        argument (a batch over 1,000 jobs) is sent as stdin when the command takes none of its own.

        A connection that turns out dead before the command ran is replaced once. If it dies while the command
        runs, the command is repeated only when ``idempotent``; otherwise ``NpaConnectionError`` is raised and the
        caller decides (sbatch reconciles by job name).
        """
        command = argv if isinstance(argv, str) else shlex.join(argv)
        if "\x00" in command:  # bash would drop the NUL silently and run another command: never send it
            raise NpaValidationError(
                f"refusing to run a remote command containing a NUL byte: {short_command(command)!r}"
            )
        wire = login_shell_command(command)
        if len(wire) > MAX_COMMAND_BYTES:  # ASCII: characters are bytes
            if stdin is not None:
                raise NpaValidationError(
                    f"remote command too long: {len(wire)} bytes once encoded for the login shell, which takes at "
                    f"most {MAX_COMMAND_BYTES} in one argument (Linux MAX_ARG_STRLEN), and its stdin is taken; "
                    f"split it: {short_command(command)!r}"
                )
            wire, stdin = SCRIPT_ON_STDIN, command.encode()
        result = await aretry(
            lambda: self._run_once(command, wire, stdin, timeout, idempotent),
            transient=lambda exc: isinstance(exc, RepeatableConnectionError),
            backoff=RERUN_BACKOFF,
            budget=Budget(attempts=RUN_ATTEMPTS),
        )
        if check and result.returncode != 0:
            status = "no exit status" if result.returncode is None else f"exit {result.returncode}"
            raise NpaRemoteError(
                f"{short_command(command)} failed on {result.host} ({status}): {result.error_text[-2000:]}"
            )
        return result

    async def _run_once(
        self, command: str, wire: str, stdin: bytes | None, timeout: float | None, idempotent: bool
    ) -> CommandResult:
        """Send ``wire`` (``command`` as the login shell receives it); messages quote ``command``."""
        conn, host, channels = await self._connection()
        started = refused = False
        try:
            async with channels:
                started = True
                process = await conn.create_process(wire, encoding=None)
                try:
                    refused = _feed(process, stdin)
                    done = await process.wait(check=False, timeout=timeout)
                finally:
                    process.close()
        except asyncssh.TimeoutError as exc:
            raise NpaRemoteError(f"command on {host} timed out after {timeout} s: {short_command(command)}") from exc
        except asyncssh.ChannelOpenError as exc:
            await self._drop(conn)
            raise RepeatableConnectionError(f"could not open a session on {host}: {exc}") from exc
        except CONNECTION_ERRORS as exc:
            await self._drop(conn)
            error = RepeatableConnectionError if idempotent or not started else NpaConnectionError
            if refused and error is NpaConnectionError:
                error = StdinRefusedConnectionError
            raise error(f"connection to {host} lost while running {short_command(command)}: {exc}") from exc
        return CommandResult(
            stdout=as_bytes(done.stdout),
            stderr=as_bytes(done.stderr),
            returncode=done.exit_status,
            host=host,
            stdin_refused=refused,
        )

    async def ashred(self, paths: Sequence[str]) -> None:
        """Overwrite and remove files (a finished job's secrets sidecar); missing files are fine."""
        if not paths:
            return
        result = await self.arun(commands.build_shred_files(paths), check=False)
        if result.returncode is None:
            raise NpaRemoteError(f"removing {', '.join(paths)} on {result.host} got no exit status")

    async def arun_batch(self, argvs: Sequence[Sequence[str] | str], timeout: float = 120) -> list[CommandResult]:
        """Read-only commands run in turn in ONE round trip; one result per command (its own exit status and
        output). A batch that got no complete answer raises, as :meth:`arun` does for one command."""
        texts = [argv if isinstance(argv, str) else shlex.join(argv) for argv in argvs]
        result = await self.arun(commands.build_batch(texts), timeout=timeout, check=False)
        if result.returncode != 0:
            raise NpaRemoteError(
                f"batched commands failed on {result.host} (exit {result.returncode}): {result.error_text[-1000:]}"
            )
        frames = commands.parse_batch(result.stdout, len(texts))
        return [CommandResult(stdout=out, stderr=err, returncode=rc, host=result.host) for rc, out, err in frames]

    async def aread_together(self, argvs: Sequence[Sequence[str] | str]) -> list[CommandResult]:
        """:meth:`arun_batch` in a round trip shared with the reads other callers on this loop send to the same
        login host meanwhile: a triggerer starting many tasks at once reads partitions and nodes, looks up names
        and checks inputs for all of them together, and a command asked twice in one batch runs once. Each
        answer comes from a command started after the call (batches never overlap). A batch that got no complete
        answer raises in each of its callers."""
        texts = [argv if isinstance(argv, str) else shlex.join(argv) for argv in argvs]
        pool, key = loop_pool(), (await self.aconfig()).pool_key
        reads = pool.reads.get(key)
        if reads is None:  # gather=0: a lone read waits for nobody; reads that come while one runs go together
            reads = pool.reads[key] = Coalescer(self._read_batch, gather=0.0)
        results = await asyncio.gather(*(reads.get(text) for text in texts))
        return cast("list[CommandResult]", results)  # every text of a batch gets its answer

    async def _read_batch(self, texts: list[str]) -> dict[str, CommandResult]:
        """One round trip, or one per READ_BATCH_BYTES of commands at once: many callers' reads stay below the
        login host's limit on one command."""
        groups = groups_below(texts, lambda text: len(text) + BATCH_FRAME_BYTES, READ_BATCH_BYTES)
        answers = await asyncio.gather(*(self.arun_batch(group) for group in groups))
        answered = zip(groups, answers, strict=True)
        return {text: result for group, results in answered for text, result in zip(group, results, strict=True)}

    async def atail_logs(
        self, requests: Sequence[tuple[str, int]], max_bytes: int = 1 << 20
    ) -> list[commands.LogChunk]:
        """New bytes of many files from their offsets, in one round trip."""
        if not requests:
            return []
        result = await self.arun(commands.build_tail_logs(requests, max_bytes), check=True)
        return commands.parse_tail_logs(result.stdout, requests)

    async def apaths_exist(self, paths: Sequence[str]) -> dict[str, bool]:
        if not paths:
            return {}
        command, _ = build_stage([], required_paths=paths)
        (result,) = await self.aread_together([command])
        if result.returncode not in (0, EXIT_MISSING_INPUTS):
            raise NpaRemoteError(f"checking paths on {result.host} failed: {result.error_text[-1000:]}")
        missing = set(parse_stage_output(result.text).missing)
        return {p: p not in missing for p in paths}

    async def apath_exists(self, path: str) -> bool:
        return (await self.apaths_exist([path]))[path]

    async def acluster_layout(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(partitions, nodes) as :meth:`apartitions` and :meth:`anodes` read them, in one round trip."""
        partitions, nodes = await self._scontrol_reads(commands.build_partitions, commands.build_scontrol_nodes)
        return commands.parse_partitions(partitions), commands.parse_scontrol_nodes(nodes)

    async def anodes(self) -> dict[str, Any]:
        (nodes,) = await self._scontrol_reads(commands.build_scontrol_nodes)
        return commands.parse_scontrol_nodes(nodes)

    async def apartitions(self) -> dict[str, Any]:
        (partitions,) = await self._scontrol_reads(commands.build_partitions)
        return commands.parse_partitions(partitions)

    async def _scontrol_reads(self, *builders: Callable[[str | None], list[str]]) -> list[str]:
        """The output of each scontrol read for this hook's cluster, read together with other callers'."""
        cluster = await self.atarget_cluster()
        results = await self.aread_together([build(cluster) for build in builders])
        for result in results:
            if result.returncode != 0:
                raise NpaRemoteError(
                    f"scontrol failed on {result.host} (exit {result.returncode}): {result.error_text[-1000:]}"
                )
        return [result.text for result in results]
