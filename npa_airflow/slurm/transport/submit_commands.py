"""Staging files and submitting a job on a login host, each in ONE round trip: inputs checked, directories made,
files written atomically with their modes, then sbatch (never retried: a connection lost while it ran is reported
as ambiguous and the operator reconciles by job name). Submissions that callers on one event loop make while
another runs (a triggerer starting many tasks) go to the login host together, one session for up to
SUBMISSIONS_PER_BATCH of them (`npa_airflow.slurm.submit.submit_batch`). Mixed into `AsyncSlurmHook`.

The shell is built in :mod:`npa_airflow.slurm.submit.staging`; what a lost connection means for a command in
:mod:`npa_airflow.slurm.transport.ssh`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from npa_airflow.common.coalesce import Coalescer
from npa_airflow.common.remote_errors import sbatch_outcome_unknown
from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaConnectionError, NpaRemoteError, NpaValidationError
from npa_airflow.slurm import commands
from npa_airflow.slurm.submit.staging import (
    EXIT_CANCELLED_BEFORE_SBATCH,
    EXIT_MISSING_INPUTS,
    StagedFile,
    build_stage,
    build_submit,
    parse_stage_output,
)
from npa_airflow.slurm.submit.submit_batch import build_submit_batch
from npa_airflow.slurm.transport.ssh import (
    MAX_COMMAND_BYTES,
    CommandResult,
    StdinRefusedConnectionError,
    groups_below,
    loop_pool,
)

if TYPE_CHECKING:
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

SUBMIT_TIMEOUT = 180.0  # one submission's session; a batch's grows by SUBMIT_TIMEOUT_PER_EXTRA per submission
SUBMIT_TIMEOUT_PER_EXTRA = 15.0
SUBMISSIONS_PER_BATCH = 16  # the triggerer's start threads (`slurm.start_trigger`): all that can wait at once
SUBMIT_BATCH_BYTES = MAX_COMMAND_BYTES // 2
SUBMIT_BATCHES_AT_ONCE = 2  # a batch held by a slow session leaves the other to serve the submissions after it


@dataclass(eq=False)  # one submission, compared by identity: two equal commands are still two jobs
class _Submission:
    command: str
    stdin: bytes = field(repr=False)
    script_path: str
    hook: SubmitCommands  # whose connection runs it (those of one batch share the connection's identity)


Answer = CommandResult | Exception  # what the login host answered, or why the submission failed or may exist


class SubmitCommands:
    """astage and astage_and_submit (the hook supplies the attributes declared here)."""

    aconfig: Callable[[], Awaitable[SlurmConnectionConfig]]
    arun: Callable[..., Awaitable[CommandResult]]
    atarget_cluster: Callable[[], Awaitable[str | None]]

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
        :func:`npa_airflow.slurm.submit.staging.build_submit`), shredding ``secret_files``.
        """
        cluster = await self.atarget_cluster()
        sbatch_args, cancel = await self._owner_options(sbatch_args, cluster, job_name, owner_comment)
        command, stdin = build_submit(
            build_stage(files, required_paths=required_paths, mkdirs=mkdirs),
            script_path,
            sbatch_args=sbatch_args,
            cluster=cluster,
            cancel_by_name=cancel,
            secret_files=secret_files,
        )
        result = await self._run_submission(command, stdin, script_path)
        return self._submitted(result, script_path)

    async def _owner_options(
        self, sbatch_args: Sequence[str], cluster: str | None, job_name: str | None, owner_comment: str | None
    ) -> tuple[Sequence[str], str | None]:
        """sbatch's arguments with the owner proof (``--comment``), and the cancel by name the login host honours
        when Airflow cancels the job while sbatch runs (None without a job name and proof)."""
        cancel = None
        if owner_comment is not None:
            sbatch_args = [*sbatch_args, f"--comment={owner_comment}"]
            if job_name:
                user = (await self.aconfig()).user
                cancel = commands.build_cancel_by_name(job_name, user, owner_comment, cluster)
        return sbatch_args, cancel

    async def _run_submission(self, command: str, stdin: bytes, script_path: str) -> CommandResult:
        """Run it once, alone or in a batch with the submissions other callers on this loop make meanwhile; a lost
        connection or a timeout is an ambiguous submission unless sbatch certainly never ran."""
        pool, key = loop_pool(), (await self.aconfig()).pool_key
        batches = pool.submissions.get(key)
        if batches is None:  # gather=0: a lone submission waits for nobody; those that come while one runs go together
            batches = pool.submissions[key] = Coalescer(_submit_batch, gather=0.0, concurrent=SUBMIT_BATCHES_AT_ONCE)
        answer = await batches.get(_Submission(command, stdin, script_path, self))
        if isinstance(answer, Exception):
            raise answer
        assert answer is not None  # every submission of a batch gets its answer
        return answer

    async def _submit_group(self, group: list[_Submission]) -> list[Answer]:
        if len(group) == 1:
            return [await self._submit_alone(group[0])]
        timeout = SUBMIT_TIMEOUT + SUBMIT_TIMEOUT_PER_EXTRA * (len(group) - 1)
        try:
            command, stdin = build_submit_batch([(each.command, each.stdin) for each in group])
            result = await self.arun(command, stdin=stdin, check=False, idempotent=False, timeout=timeout)
            frames, _ = commands.parse_batch_frames(result.stdout, len(group))
        except NpaValidationError as exc:  # refused before anything was sent
            return [exc for _ in group]
        except Exception as exc:  # lost, timed out or garbled: any of them may have run sbatch (stdin read or not)
            return [
                _caused(
                    NpaAmbiguousSubmission(
                        f"submission of {each.script_path} in a batch of {len(group)} did not finish: {exc}"
                    ),
                    exc,
                )
                for each in group
            ]
        answers: list[Answer] = [CommandResult(out, err, rc, result.host) for rc, out, err in frames]
        for each in group[len(frames) :]:
            answers.append(
                NpaAmbiguousSubmission(
                    f"a batch of {len(group)} submissions on {result.host} ended (exit {result.returncode}) "
                    f"before the answer for {each.script_path}: {result.error_text[-1000:]}"
                )
            )
        return answers

    async def _submit_alone(self, each: _Submission) -> Answer:
        try:
            return await self.arun(
                each.command, stdin=each.stdin, check=False, idempotent=False, timeout=SUBMIT_TIMEOUT
            )
        except StdinRefusedConnectionError as exc:  # every file (the script too) is read before sbatch runs
            return _caused(
                NpaRemoteError(
                    f"the login host closed the session for {each.script_path} before reading the staged files, then "
                    f"the connection was lost; sbatch never ran: {exc}"
                ),
                exc,
            )
        except NpaConnectionError as exc:
            return _caused(
                NpaAmbiguousSubmission(f"connection lost during submission of {each.script_path}: {exc}"), exc
            )
        except NpaRemoteError as exc:  # timed out: sbatch may have created the job
            return _caused(NpaAmbiguousSubmission(f"submission of {each.script_path} did not finish: {exc}"), exc)
        except Exception as exc:  # refused before it was sent (NpaValidationError), or a bug: its caller sees it
            return exc

    def _submitted(self, result: CommandResult, script_path: str) -> commands.SubmitResult:
        """What sbatch answered, or the error that says whether the job may exist."""
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


async def _submit_batch(submissions: list[_Submission]) -> dict[_Submission, Answer]:
    """Every submission's answer; never raises (a batch's failure is each submission's own answer)."""
    groups = groups_below(  # 300: the frame's shell around each
        submissions, lambda each: len(each.command) + 300, SUBMIT_BATCH_BYTES, SUBMISSIONS_PER_BATCH
    )
    answers = await asyncio.gather(*(group[0].hook._submit_group(group) for group in groups))
    return {
        each: answer
        for group, got in zip(groups, answers, strict=True)
        for each, answer in zip(group, got, strict=True)
    }


def _caused(error: Exception, cause: Exception) -> Exception:
    error.__cause__ = cause
    return error
