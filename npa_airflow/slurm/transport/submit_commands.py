"""Staging files and submitting a job on a login host, each in ONE round trip: inputs checked, directories made,
files written atomically with their modes, then sbatch (never retried: a connection lost while it ran is reported
as ambiguous and the operator reconciles by job name). Mixed into `AsyncSlurmHook`.

The shell is built in :mod:`npa_airflow.slurm.submit.staging`; what a lost connection means for a command in
:mod:`npa_airflow.slurm.transport.ssh`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

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
from npa_airflow.slurm.transport.ssh import StdinRefusedConnectionError

if TYPE_CHECKING:
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
    from npa_airflow.slurm.transport.ssh import CommandResult


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
        """Run it once; a lost connection or a timeout is an ambiguous submission unless sbatch certainly never ran."""
        try:
            result = await self.arun(command, stdin=stdin, check=False, idempotent=False, timeout=180)
        except StdinRefusedConnectionError as exc:  # every file (the script too) is read before sbatch runs
            raise NpaRemoteError(
                f"the login host closed the session for {script_path} before reading the staged files, then the "
                f"connection was lost; sbatch never ran: {exc}"
            ) from exc
        except NpaConnectionError as exc:
            raise NpaAmbiguousSubmission(f"connection lost during submission of {script_path}: {exc}") from exc
        except NpaRemoteError as exc:  # timed out: sbatch may have created the job
            raise NpaAmbiguousSubmission(f"submission of {script_path} did not finish: {exc}") from exc
        return result

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
