"""Cancelling Slurm jobs so that a cancel is reported only when it happened. Mixed into `AsyncSlurmHook`.

Every cancel Airflow makes can first create the job's cancel marker (`commands.cancel_marker_for`): a later try
tells Airflow's cancels from anyone else's by it, and a submission still in flight cancels its own job when it
finds it (`npa_airflow.slurm.staging`).

scancel of Slurm 22.05 exits 0, silently, for a job id slurmctld does not know (another cluster's, or one purged
MinJobAge after it ended), and other versions say "Invalid job id specified". Neither proves anything, so a
cancel counts only when slurmctld still knows the job (it took the cancel) or accounting shows it finished.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from npa_airflow.common.remote_errors import scancel_nothing_to_cancel, slurmctld_unreachable, squeue_job_id_unknown
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaCancelFailed, NpaRemoteError
from npa_airflow.slurm import commands

if TYPE_CHECKING:
    from npa_airflow.slurm.connection import SlurmConnectionConfig
    from npa_airflow.slurm.ssh import CommandResult

CANCELLED = "cancelled"  # slurmctld took the cancel (or the job was already cancelled)
ENDED = "ended"  # the job had already ended: nothing left to cancel


def _recorded(command: str, marker: str | None) -> str:
    """``command`` (shell), preceded by the creation of Airflow's cancel marker when there is one."""
    return f"{commands.build_record_cancel(marker)}; {command}" if marker else command


def _raise_for_scancel(result: CommandResult, what: str) -> None:
    if result.returncode == 0 or scancel_nothing_to_cancel(result.error_text):
        return
    message = f"scancel {what} failed on {result.host} (exit {result.returncode}): {result.error_text[-1000:]}"
    if result.returncode is None or slurmctld_unreachable(result.error_text):
        raise NpaRemoteError(message)  # the controller did not answer: asking again may work
    raise NpaCancelFailed(message)  # e.g. "Access/permission denied": asking again will not help


class CancelCommands:
    """scancel by id (checked) or by a try's exact job name, and who cancelled a job."""

    aconfig: Callable[[], Awaitable[SlurmConnectionConfig]]
    arun: Callable[..., Awaitable[CommandResult]]
    atarget_cluster: Callable[[], Awaitable[str | None]]
    ashred: Callable[[Sequence[str]], Awaitable[None]]

    async def acancel(self, job_id: str, *, marker: str | None = None, shred: Sequence[str] = ()) -> str:
        """scancel ``job_id`` (creating ``marker`` first); return CANCELLED or ENDED.

        ``shred``: the job's secret files (its sidecar). A cancelled or ended job never runs again, so they go
        in scancel's round trip when it succeeds, else once the job is known to have ended.

        Raises ``NpaRemoteError`` when the cluster did not answer (worth retrying) and ``NpaCancelFailed`` when
        nothing was cancelled: scancel refused, or the cluster does not know the job and accounting does not
        show it finished (a wrong job id or cluster).
        """
        cluster = await self.atarget_cluster()
        command = _recorded(commands.build_cancel_and_shred(job_id, shred, cluster), marker)
        result = await self.arun(command, check=False)
        _raise_for_scancel(result, job_id)
        outcome = await self._cancel_outcome(job_id, cluster)
        if result.returncode != 0:
            await self.ashred(shred)  # scancel found nothing to cancel: the shred after it did not run
        return outcome

    async def _cancel_outcome(self, job_id: str, cluster: str | None) -> str:
        """What the scancel that just ran did, from slurmctld's view, else from accounting."""
        squeue = await self.arun(commands.build_squeue_states([job_id], cluster), check=False)
        if squeue.returncode == 0:
            live = commands.parse_squeue(squeue.text).get(job_id)
            if live is not None:
                return ENDED if live.state in (JobState.COMPLETE, JobState.ERROR) else CANCELLED
        elif not squeue_job_id_unknown(squeue.error_text):
            raise NpaRemoteError(f"could not check the cancel of Slurm job {job_id}: {squeue.error_text[-500:]}")
        sacct = await self.arun(commands.build_sacct_states([job_id], cluster), check=False)
        if sacct.returncode != 0:
            raise NpaRemoteError(f"could not check the cancel of Slurm job {job_id}: {sacct.error_text[-500:]}")
        record = commands.parse_sacct(sacct.text).get(job_id)
        if record is not None and record.state.is_terminal:
            return ENDED
        seen = "has no record of it" if record is None else f"still shows it {record.native_state}"
        raise NpaCancelFailed(
            f"nothing was cancelled: slurmctld on {squeue.host} does not know Slurm job {job_id} and accounting "
            f"{seen}. Check the job id and the cluster (connection extra cluster_name) with "
            f"`sacct -j {job_id}` and `squeue -j {job_id}`."
        )

    async def acancel_by_name(self, job_name: str, *, marker: str | None = None, shred: Sequence[str] = ()) -> None:
        """scancel the connection user's jobs named exactly ``job_name``, creating ``marker`` first.

        For a job whose id is not known yet (sbatch or the reconciliation of an ambiguous submission still in
        flight). Job names carry the task instance and the try (`npa_airflow.common.naming`), so no other try's
        or task's job has this name; `--user` keeps other users' jobs of the same name out of it.
        """
        cfg = await self.aconfig()
        command = shlex.join(commands.build_cancel_by_name(job_name, cfg.user, await self.atarget_cluster()))
        if shred:  # the job's sidecar: a cancelled job never runs again
            command = f"{command} || exit $?; {commands.build_shred_files(shred)}"
        result = await self.arun(_recorded(command, marker), check=False)
        _raise_for_scancel(result, f"--name={job_name}")

    async def acancel_origin(self, job_id: str, marker: str | None) -> commands.CancelOrigin:
        """Who cancelled ``job_id``: Airflow (``marker`` exists) or the uid accounting names."""
        result = await self.arun(commands.build_cancel_origin(job_id, marker, await self.atarget_cluster()))
        return commands.parse_cancel_origin(result.text)
