"""The async core of SlurmHook: every Slurm command a trigger or an operator runs on a login host.

Commands that are not safe to repeat (sbatch) are never retried: a connection lost while they ran is reported as
ambiguous. The sync methods operators call live in :mod:`npa_airflow.slurm.hook`; the transport in
:mod:`npa_airflow.slurm.ssh`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

import asyncssh

from npa_airflow.common.configured_hook import ConfiguredHook
from npa_airflow.common.remote_errors import sbatch_outcome_unknown, squeue_job_id_unknown
from npa_airflow.common.retry import Backoff, Budget, aretry
from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaConnectionError, NpaRemoteError, NpaValidationError
from npa_airflow.slurm import commands
from npa_airflow.slurm.accounting_mode import AccountingMode
from npa_airflow.slurm.cancels import CancelCommands
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.end_records import ended_before_accounting, split_end_records, with_end_records
from npa_airflow.slurm.ssh import (
    CONNECTION_ERRORS,
    MAX_CHANNELS_PER_CONNECTION,
    MAX_COMMAND_BYTES,
    SCRIPT_ON_STDIN,
    CommandResult,
    as_bytes,
    login_shell_command,
    loop_pool,
    open_connection,
    short_command,
)
from npa_airflow.slurm.staging import (
    EXIT_CANCELLED_BEFORE_SBATCH,
    EXIT_MISSING_INPUTS,
    StagedFile,
    build_stage,
    build_stage_and_submit,
    parse_stage_output,
)

# A command whose connection died is run once more on a new connection, at once.
RERUN_BACKOFF = Backoff(base=0.0, cap=0.0, jitter=0.0)
RUN_ATTEMPTS = 2
H = TypeVar("H", bound="AsyncSlurmHook")


class _RepeatableConnectionError(NpaConnectionError):
    """The connection died where running the command again is safe (it had not started, or is idempotent)."""


class _StdinRefusedConnectionError(NpaConnectionError):
    """The connection died after the remote side had closed stdin unread: the command never got its input."""


def _feed(process: asyncssh.SSHClientProcess[bytes], stdin: bytes | None) -> bool:
    """Write ``stdin`` and EOF; True when the channel was already closed for sending (the command had exited)."""
    try:
        if stdin:
            process.stdin.write(stdin)
        process.stdin.write_eof()  # always: a command that reads stdin must never wait for more
    except BrokenPipeError:  # asyncssh: "Channel not open for sending"
        return True
    return False


class AsyncSlurmHook(ConfiguredHook[SlurmConnectionConfig], CancelCommands, AccountingMode):
    """The async Slurm commands over SSH; :class:`npa_airflow.slurm.hook.SlurmHook` adds the sync facade.

    Every Slurm command names one cluster with ``-M``: ``cluster`` when given (the cluster a job handle
    records), else the connection's ``cluster_name``; neither means the login host's default cluster (no -M).
    The cancels (checked, by id or by a try's job name) come from :class:`npa_airflow.slurm.cancels.CancelCommands`,
    and what a cluster without accounting needs from :class:`npa_airflow.slurm.accounting_mode.AccountingMode`.
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
            transient=lambda exc: isinstance(exc, _RepeatableConnectionError),
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
            raise _RepeatableConnectionError(f"could not open a session on {host}: {exc}") from exc
        except CONNECTION_ERRORS as exc:
            await self._drop(conn)
            error = _RepeatableConnectionError if idempotent or not started else NpaConnectionError
            if refused and error is NpaConnectionError:
                error = _StdinRefusedConnectionError
            raise error(f"connection to {host} lost while running {short_command(command)}: {exc}") from exc
        return CommandResult(
            stdout=as_bytes(done.stdout),
            stderr=as_bytes(done.stderr),
            returncode=done.exit_status,
            host=host,
            stdin_refused=refused,
        )

    async def astage(
        self, files: Sequence[StagedFile], *, required_paths: Sequence[str] = (), mkdirs: Sequence[str] = ()
    ) -> None:
        """Check inputs exist, create dirs and write files atomically with their modes, in one round trip.

        Public for DAG code that puts files on shared storage (dags_examples/slurm_training.py stages its script).
        """
        command, stdin = build_stage(files, required_paths=required_paths, mkdirs=mkdirs)
        result = await self.arun(command, stdin=stdin, check=False)
        self._raise_for_stage(result)

    async def astage_and_submit(
        self,
        files: Sequence[StagedFile],
        script_path: str,
        *,
        sbatch_args: Sequence[str] = (),
        required_paths: Sequence[str] = (),
        mkdirs: Sequence[str] = (),
        job_name: str | None = None,
        owner_comment: str | None = None,
        secret_files: Sequence[str] = (),
    ) -> commands.SubmitResult:
        """Check inputs, stage files and submit, all in ONE round trip.

        Raises ``NpaValidationError`` (nothing written) when a required input is missing, ``NpaRemoteError`` when
        sbatch clearly refused the job, and ``NpaAmbiguousSubmission`` when the job may or may not exist. With
        ``job_name`` (the script's job name) and ``owner_comment`` (the proof of its owner, sbatch's ``--comment``),
        a cancel by Airflow that comes while sbatch runs is honoured on the login host (see
        :func:`npa_airflow.slurm.staging.build_stage_and_submit`), shredding ``secret_files``.
        """
        cluster = await self.atarget_cluster()
        cancel = None
        if owner_comment is not None:
            sbatch_args = [*sbatch_args, f"--comment={owner_comment}"]
            if job_name:
                user = (await self.aconfig()).user
                cancel = commands.build_cancel_by_name(job_name, user, owner_comment, cluster)
        command, stdin = build_stage_and_submit(
            files,
            script_path,
            sbatch_args=sbatch_args,
            required_paths=required_paths,
            mkdirs=mkdirs,
            cluster=cluster,
            cancel_by_name=cancel,
            secret_files=secret_files,
        )
        try:
            result = await self.arun(command, stdin=stdin, check=False, idempotent=False, timeout=180)
        except _StdinRefusedConnectionError as exc:  # every file (the script too) is read before sbatch runs
            raise NpaRemoteError(
                f"the login host closed the session for {script_path} before reading the staged files, then the "
                f"connection was lost; sbatch never ran: {exc}"
            ) from exc
        except NpaConnectionError as exc:
            raise NpaAmbiguousSubmission(f"connection lost during submission of {script_path}: {exc}") from exc
        except NpaRemoteError as exc:  # timed out: sbatch may have created the job
            raise NpaAmbiguousSubmission(f"submission of {script_path} did not finish: {exc}") from exc
        if result.returncode is None and self._refused_before_sbatch(result):
            self._raise_for_stage(result)
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
    def _refused_before_sbatch(result: CommandResult) -> bool:
        """No exit status, but certainly nothing submitted: the script reported missing inputs (it exits right
        after), or it closed stdin unread (sbatch runs only after every staged file was read) and never printed
        the marker it prints before sbatch."""
        outcome = parse_stage_output(result.text)
        return bool(outcome.missing) or (result.stdin_refused and not outcome.sbatch_started)

    @staticmethod
    def _raise_for_stage(result: CommandResult) -> None:
        missing = parse_stage_output(result.text).missing
        if result.returncode == EXIT_MISSING_INPUTS or (result.returncode is None and missing):
            raise NpaValidationError(
                "required inputs do not exist on the cluster (checked with test -e from "
                f"{result.host}): {', '.join(missing)}. Stage the data on shared storage (e.g. Lustre) first, "
                "or correct the paths; nothing was written or submitted."
            )
        if result.returncode == EXIT_CANCELLED_BEFORE_SBATCH:
            raise NpaRemoteError(
                f"not submitted: Airflow had cancelled this job (its cancel marker exists on {result.host}): "
                "the task was killed while it was being submitted"
            )
        if result.returncode not in (0, None):
            raise NpaRemoteError(
                f"staging files on {result.host} failed (exit {result.returncode}): {result.error_text[-2000:]}"
            )
        if result.returncode is None:
            raise NpaRemoteError(
                f"staging files on {result.host} ended without an exit status before sbatch ran (nothing was "
                f"submitted): {result.error_text[-2000:]}"
            )

    async def ajob_states(self, job_ids: Sequence[str]) -> dict[str, commands.SlurmJobInfo]:
        """States of many jobs: ONE sacct, plus ONE squeue only for ids accounting does not know yet or says
        ended in a state Slurm requeues from (NODE_FAIL: the same job may be PENDING again)."""
        return (await self.aquery_jobs(job_ids)).states

    async def aquery_jobs(
        self,
        job_ids: Sequence[str],
        end_records: Mapping[str, str] | None = None,
        pending: Collection[str] = (),
        end_record_paths: Mapping[str, str] | None = None,
    ) -> commands.JobQuery:
        """Like :meth:`ajob_states`, and which ids are certainly absent: every tool asked answered without them.

        `pending` are the ids last seen pending (or not seen yet): ONE squeue for them runs in the same round trip
        as the sacct, because a pending job's reason is true only in slurmctld on every Slurm version (24.11's sacct
        prints Reason=None for every pending job) and a job sacct does not know yet is there too. A job squeue shows
        queued or running takes its answer (:func:`commands.merge_pending_states`).

        With sacct unanswered (slurmdbd down), a job missing from squeue may simply have ended: not absent.
        `end_records` ({job id: path} of jobs not seen ended) are looked for in the sacct command; a job whose
        record exists while sacct says it pends or runs joins the squeue, which settles it as COMPLETED before
        accounting does (npa_airflow.slurm.end_records). The other ids sacct cannot settle (unknown to it, or
        ended in a state Slurm requeues from) get a second squeue after it: a pure state check, with
        ``--only-job-state`` where the login host's squeue has it (learnt once per connection). At most one sacct
        and two squeues.

        On a cluster without accounting (learnt from sacct's answer once per connection) no sacct runs: ONE
        squeue reads every job, with the end records of `end_record_paths` ({job id: path}, every job whose
        record is known) in the same command (:meth:`_aquery_without_accounting`).
        """
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return commands.JobQuery({})
        cluster = await self.atarget_cluster()
        all_records = {**(end_records or {}), **(end_record_paths or {})}
        if await self.aaccounting() is False:
            return await self._aquery_without_accounting(ids, cluster, all_records)
        records = {i: p for i, p in (end_records or {}).items() if i in ids and p}
        sacct_argv = commands.build_sacct_states(ids, cluster)
        command = with_end_records(sacct_argv, list(records.values())) if records else sacct_argv
        wanted = set(pending)
        live_ids = [i for i in ids if i in wanted]
        if live_ids:
            sacct, squeue = await self.arun_batch([command, commands.build_squeue_states(live_ids, cluster)])
        else:
            sacct, squeue = await self.arun(command, check=False), None
        if sacct.returncode != 0 and await self.alearn_accounting(sacct):
            return await self._aquery_without_accounting(ids, cluster, all_records)
        seen, sacct_text = split_end_records(sacct.text, list(records.values())) if records else ({}, sacct.text)
        accounted = commands.parse_sacct(sacct_text) if sacct.returncode == 0 else {}
        answers: list[tuple[CommandResult, Sequence[str]]] = []  # each squeue that ran and the ids it asked about
        found = dict(accounted)
        answered: set[str] = set()  # ids a squeue answered for (with them or without)
        live: dict[str, commands.SlurmJobInfo] = {}
        if squeue is not None:
            answers.append((squeue, live_ids))
            first = self._live_answer(squeue)
            if first is not None:
                found = commands.merge_pending_states(found, first, live_ids)
                answered.update(live_ids)
                live.update(first)
        # Not yet ended for accounting: RUNNING, or still PENDING when slurmdbd stalled before the job's start.
        unsettled = {i for i, info in accounted.items() if not info.state.is_terminal}
        ending = [i for i, path in records.items() if seen.get(path) and i in unsettled]
        asked = [
            i
            for i in ids
            if i not in answered and (i not in accounted or commands.may_run_again(accounted[i]) or i in ending)
        ]
        if asked:
            check, second = await self._squeue_states_only(asked, cluster)
            answers.append((check, asked))
            found = commands.merge_live_states(found, second, asked)
            if second is not None:
                answered.update(asked)
                live.update(second)
        if sacct.returncode != 0 and answers and not answered:
            errors = "; ".join(f"squeue: {result.error_text[-500:]}" for result, _ in answers)
            raise NpaRemoteError(
                f"neither sacct nor squeue answered on {sacct.host}: sacct: {sacct.error_text[-500:]}; {errors}"
            )
        early = ended_before_accounting(accounted, live, [i for i in ending if i in answered])
        found.update(early)
        states = {i: found[i] for i in ids if i in found}
        answered_by_all = answered if sacct.returncode == 0 else set()
        return commands.JobQuery(
            states,
            frozenset(i for i in ids if i not in states and i in answered_by_all),
            end_records_checked=frozenset(ending),
            ended_before_accounting=frozenset(early),
        )

    @staticmethod
    def _live_answer(result: CommandResult) -> dict[str, commands.SlurmJobInfo] | None:
        """squeue's answer: its jobs, {} when the one id asked is unknown to slurmctld, None when it did not answer."""
        if result.returncode == 0:
            return commands.parse_squeue(result.text)
        if squeue_job_id_unknown(result.error_text):
            return {}  # an answer ("not there"), not a failure
        return None

    async def _squeue_states_only(
        self, job_ids: Sequence[str], cluster: str | None
    ) -> tuple[CommandResult, dict[str, commands.SlurmJobInfo] | None]:
        """One squeue that only reads states: ``--only-job-state`` (a lighter slurmctld RPC) where the login host's
        squeue has it and no cluster is named (24.11.5 ignores -M with it). Whether it has it is learnt from the
        first such command on a connection, which checks for itself."""
        pool, key = loop_pool(), (await self.aconfig()).pool_key
        known = pool.only_job_state.get(key)
        if cluster is not None or known is False:
            argv: Sequence[str] | str = commands.build_squeue_states(job_ids, cluster)
        elif known:
            argv = commands.build_squeue_only_states(job_ids)
        else:
            argv = commands.build_squeue_states_detecting(job_ids)
        result = await self.arun(argv, check=False)
        if isinstance(argv, str):
            only, text = commands.split_squeue_form(result.text)
            if only is not None:
                pool.only_job_state[key] = only
                result = dataclasses.replace(result, stdout=text.encode())
        return result, self._live_answer(result)

    async def asubmit_time(self, job_id: str) -> float | None:
        """When ``job_id`` was submitted (epoch seconds, Slurm's own record), or None if neither tool says."""
        accounting = await self.aaccounting() is not False
        command = commands.build_submit_time(job_id, await self.atarget_cluster(), accounting=accounting)
        result = await self.arun(command, check=False)
        return commands.parse_submit_time(result.text, job_id)

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
        result = await self.arun(commands.build_batch(argvs), timeout=timeout, check=False)
        if result.returncode != 0:
            raise NpaRemoteError(
                f"batched commands failed on {result.host} (exit {result.returncode}): {result.error_text[-1000:]}"
            )
        frames = commands.parse_batch(result.stdout, len(argvs))
        return [CommandResult(stdout=out, stderr=err, returncode=rc, host=result.host) for rc, out, err in frames]

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
        result = await self.arun(command, check=False)
        if result.returncode not in (0, EXIT_MISSING_INPUTS):
            raise NpaRemoteError(f"checking paths on {result.host} failed: {result.error_text[-1000:]}")
        missing = set(parse_stage_output(result.text).missing)
        return {p: p not in missing for p in paths}

    async def apath_exists(self, path: str) -> bool:
        return (await self.apaths_exist([path]))[path]

    async def afind_jobs_by_name(self, names: Sequence[str]) -> list[commands.SlurmJobInfo]:
        """The connection user's jobs whose name is exactly one of ``names``, from squeue (live) and sacct
        (accounted), merged by id, with their comment and submit time (who owns each: `common.deployment`)."""
        names = list(dict.fromkeys(names))
        if not names:
            return []
        cluster = await self.atarget_cluster()
        user = (await self.aconfig()).user
        found: dict[str, commands.SlurmJobInfo] = {}
        reads = [commands.build_find_by_name_squeue(names, user, cluster)]
        if await self.aaccounting() is not False:  # without accounting, slurmctld's view is all there is
            reads.insert(0, commands.build_find_by_name_sacct(names, user, cluster))
        *accounted, squeue = await self.arun_batch(reads)
        sacct = accounted[0] if accounted else None
        if sacct is not None and sacct.returncode == 0:
            found.update(commands.parse_sacct(sacct.text, commands.FIND_SACCT_FIELDS))
        if sacct is not None:
            await self.alearn_accounting(sacct)
        if squeue.returncode == 0:  # the live view wins over accounting's lag, and it always has the comment
            found.update(commands.parse_squeue(squeue.text, commands.FIND_SQUEUE_FIELDS))
        if (sacct is None or sacct.returncode != 0) and squeue.returncode != 0:
            raise NpaRemoteError(f"could not look up jobs by name on {squeue.host}: {squeue.error_text[-500:]}")
        wanted = set(names)
        return [info for info in found.values() if info.job_name in wanted]

    async def acluster_layout(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(partitions, nodes) as :meth:`apartitions` and :meth:`anodes` read them, in one round trip."""
        cluster = await self.atarget_cluster()
        partitions, nodes = await self.arun_batch(
            [commands.build_partitions(cluster), commands.build_scontrol_nodes(cluster)]
        )
        for result in (partitions, nodes):
            if result.returncode != 0:
                raise NpaRemoteError(
                    f"scontrol failed on {result.host} (exit {result.returncode}): {result.error_text[-1000:]}"
                )
        return commands.parse_partitions(partitions.text), commands.parse_scontrol_nodes(nodes.text)

    async def anodes(self) -> dict[str, Any]:
        result = await self.arun(commands.build_scontrol_nodes(await self.atarget_cluster()))
        return commands.parse_scontrol_nodes(result.text)

    async def apartitions(self) -> dict[str, Any]:
        result = await self.arun(commands.build_partitions(await self.atarget_cluster()))
        return commands.parse_partitions(result.text)
