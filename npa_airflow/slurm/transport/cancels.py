"""Cancelling Slurm jobs so that a cancel is reported only when it happened. Mixed into `AsyncSlurmHook`.

Every cancel Airflow makes can first create the job's cancel marker (`cancel_marker_of`): a later try tells
Airflow's cancels from anyone else's by it, and a submission still in flight cancels its own job when it finds it
(`npa_airflow.slurm.submit.staging`). What a cancel acts on (`CancelRequest`: the marker, the secret files to shred, the
end record, the job name to check the id against) is derived here, from the job's handle, for every entry point:
the operator, the trigger (its deadline and on_kill) and the API server's listener.

scancel of Slurm 22.05 exits 0, silently, for a job id slurmctld does not know (another cluster's, or one purged
MinJobAge after it ended), and other versions say "Invalid job id specified". Neither proves anything, so a
cancel counts only when slurmctld still knows the job (it took the cancel) or accounting shows it finished. On a
cluster without accounting, the job's own end record (its batch script's last write) is what shows it finished.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from npa_airflow.common.remote_errors import scancel_nothing_to_cancel, slurmctld_unreachable, squeue_job_id_unknown
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaCancelFailed, NpaRemoteError
from npa_airflow.slurm import commands
from npa_airflow.slurm.handle import end_record_for

if TYPE_CHECKING:
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
    from npa_airflow.slurm.transport.ssh import CommandResult

CANCELLED = "cancelled"  # slurmctld took the cancel (or the job was already cancelled)
ENDED = "ended"  # the job had already ended: nothing left to cancel


@dataclass(frozen=True)
class CancelRequest:
    """One job to cancel: its id, Airflow's cancel marker to create first, its secret files to shred.

    With ``job_name``, the id is cancelled only if it is a job of the connection's user with that name: an id read
    from somewhere else (a handle in XCom) cannot make the cancel reach another task's or another user's job.
    """

    job_id: str
    marker: str | None = None
    shred: tuple[str, ...] = ()
    job_name: str | None = None
    end_record: str | None = None  # the job's end record: shows it ended where there is no accounting

    @classmethod
    def for_handle(cls, handle: SlurmJobHandle) -> CancelRequest:
        """The cancel of a submitted job: its marker, its sidecar, its end record, and its id checked against its
        name."""
        return cls.for_job(
            handle.job_id,
            handle.job_name,
            script_path=handle.script_path,
            shred=handle.secret_files,
            results_dir=handle.results_dir,
        )

    @classmethod
    def for_job(
        cls,
        job_id: str,
        job_name: str | None,
        *,
        script_path: str | None,
        shred: Sequence[str] = (),
        results_dir: str | None = None,
    ) -> CancelRequest:
        """The cancel of ``job_id``, submitted from ``script_path``; with ``results_dir``, its end record is looked
        for where the cluster keeps no accounting."""
        return cls(job_id, cancel_marker_of(script_path), tuple(shred), job_name, end_record_for(results_dir))


def cancel_marker_of(script_path: str | None) -> str | None:
    """Airflow's cancel marker of the job submitted from ``script_path`` (None: its script, so its marker, is not
    known)."""
    return commands.cancel_marker_for(script_path) if script_path else None


def _not_this_job(request: CancelRequest, why: str) -> NpaCancelFailed:
    return NpaCancelFailed(
        f"nothing was cancelled: Slurm job {request.job_id} was to be {request.job_name}, but {why}. Check the job id "
        f"and the cluster (connection extra cluster_name) with `sacct -j {request.job_id}` and "
        f"`squeue -j {request.job_id}`."
    )


def _unchecked(job_ids: Sequence[str], error_text: str) -> NpaRemoteError:
    shown = ", ".join(job_ids[:5]) + (f" and {len(job_ids) - 5} more" if len(job_ids) > 5 else "")
    return NpaRemoteError(f"could not check the cancel of Slurm job {shown}: {error_text[-500:]}")


def _scancel_took_it(result: CommandResult) -> bool:
    """scancel succeeded, or every complaint it made (one line per job) is that a job had nothing to cancel."""
    if result.returncode == 0:
        return True
    lines = [line for line in result.error_text.splitlines() if line.strip()]
    return bool(lines) and all(scancel_nothing_to_cancel(line) for line in lines)


def _recorded(command: str, *markers: str | None) -> str:
    """``command`` (shell), preceded by the creation of Airflow's cancel markers (those given)."""
    records = [commands.build_record_cancel(marker) for marker in markers if marker]
    return "; ".join([*records, command])


def _raise_for_scancel(result: CommandResult, what: str) -> None:
    if _scancel_took_it(result):
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
    apaths_exist: Callable[[Sequence[str]], Awaitable[dict[str, bool]]]
    aaccounting: Callable[[], Awaitable[bool | None]]
    alearn_accounting: Callable[[CommandResult], Awaitable[bool]]
    alearn_from_sacct_error: Callable[[str, str], Awaitable[bool]]

    async def acancel(
        self,
        job_id: str,
        *,
        job_name: str | None = None,
        marker: str | None = None,
        shred: Sequence[str] = (),
        end_record: str | None = None,
    ) -> str:
        """scancel ``job_id`` (creating ``marker`` first); return CANCELLED or ENDED. With ``job_name``, only if
        ``job_id`` is the connection user's job of that name (see :class:`CancelRequest`).

        ``shred``: the job's secret files (its sidecar). A cancelled or ended job never runs again, so they go
        in scancel's round trip when it succeeds, else once the job is known to have ended.

        Raises ``NpaRemoteError`` when the cluster did not answer (worth retrying) and ``NpaCancelFailed`` when
        nothing was cancelled: scancel refused, or the cluster does not know the job and accounting does not
        show it finished (a wrong job id or cluster). ``end_record``: the job's end record, which shows that it
        finished on a cluster without accounting.
        """
        return await self.acancel_one(CancelRequest(job_id, marker, tuple(shred), job_name, end_record))

    async def acancel_one(self, request: CancelRequest) -> str:
        """:meth:`acancel` of one :class:`CancelRequest`: CANCELLED or ENDED, else it raises."""
        outcome = (await self.acancel_many([request]))[request]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def acancel_many(self, requests: Sequence[CancelRequest]) -> dict[CancelRequest, str | Exception]:
        """:meth:`acancel` for many jobs in one scancel round trip and one squeue (plus one sacct for the jobs
        slurmctld no longer knows): {request: CANCELLED, ENDED or the exception acancel would raise}.

        A scancel refused for some job (exit status, not "nothing to cancel") is retried job by job, so that
        only the refused jobs get NpaCancelFailed. A request with a ``job_name`` whose id is not the connection
        user's job of that name gets NpaCancelFailed without any scancel. Raises NpaRemoteError when the cluster
        did not answer.
        """
        if not requests:
            return {}
        cluster = await self.atarget_cluster()
        settled = await self._settle_by_owner([r for r in requests if r.job_name], cluster)
        rest = [r for r in requests if r not in settled]
        return {**settled, **(await self._cancel_checked(rest, cluster) if rest else {})}

    async def _settle_by_owner(
        self, requests: Sequence[CancelRequest], cluster: str | None
    ) -> dict[CancelRequest, str | Exception]:
        """The outcome of each named request that needs no scancel: its id is another job (refused), or no job of
        this user that slurmctld still knows (ENDED if accounting shows this user's job of that name finished,
        else refused). The others (this user's live job of that name) are left for scancel."""
        if not requests:
            return {}
        user = (await self.aconfig()).user
        ids = list(dict.fromkeys(r.job_id for r in requests))
        squeue = await self.arun(commands.build_squeue_states(ids, cluster, user=user), check=False)
        if squeue.returncode != 0 and not squeue_job_id_unknown(squeue.error_text):
            raise _unchecked(ids, squeue.error_text)
        live = commands.parse_squeue(squeue.text) if squeue.returncode == 0 else {}
        settled: dict[CancelRequest, str | Exception] = {}
        gone = [r for r in requests if r.job_id not in live]
        for r in requests:
            info = live.get(r.job_id)
            if info is not None and info.job_name != r.job_name:
                settled[r] = _not_this_job(r, f"the job with that id is {info.job_name}, not this task's")
        if gone:
            settled.update(await self._settle_gone(gone, cluster, user))
        ended_files = [p for r, outcome in settled.items() if outcome == ENDED for p in r.shred]
        await self.ashred(ended_files)
        return settled

    async def _settle_gone(
        self, gone: Sequence[CancelRequest], cluster: str | None, user: str
    ) -> dict[CancelRequest, str | Exception]:
        """Named requests whose id slurmctld does not know as this user's job: ENDED when accounting (else the end
        record) shows that the job of that name finished, refused otherwise."""
        ids = [r.job_id for r in gone]
        if await self.aaccounting() is not False:
            sacct = await self.arun(commands.build_sacct_states(ids, cluster, user=user), check=False)
            if sacct.returncode == 0:
                return {r: _settled_by_accounting(r, commands.parse_sacct(sacct.text), user) for r in gone}
            if not await self.alearn_accounting(sacct):
                raise _unchecked(ids, sacct.error_text)
        ended = await self._ended_by_record(gone)
        why = f"slurmctld does not know it as a job of user {user}, and the cluster keeps no accounting"
        return {r: ENDED if ended[r] else _not_this_job(r, f"{why}; {_no_record(r)}") for r in gone}

    async def _ended_by_record(self, requests: Sequence[CancelRequest]) -> dict[CancelRequest, bool]:
        """Whether each job's end record exists (the job's script finished), in one round trip."""
        paths = list(dict.fromkeys(r.end_record for r in requests if r.end_record))
        exists = await self.apaths_exist(paths) if paths else {}
        return {r: bool(r.end_record and exists.get(r.end_record)) for r in requests}

    async def _cancel_checked(
        self, requests: Sequence[CancelRequest], cluster: str | None
    ) -> dict[CancelRequest, str | Exception]:
        ids = list(dict.fromkeys(r.job_id for r in requests))
        shred = [path for r in requests for path in r.shred]
        command = _recorded(commands.build_cancel_and_shred(ids, shred, cluster), *(r.marker for r in requests))
        result = await self.arun(command, check=False)
        if len(requests) > 1 and not _scancel_took_it(result):
            if result.returncode is None or slurmctld_unreachable(result.error_text):
                _raise_for_scancel(result, f"of {len(ids)} jobs")
            return {r: await self._outcome_alone(r) for r in requests}  # which job was refused?
        _raise_for_scancel(result, ids[0] if len(ids) == 1 else f"of {len(ids)} jobs")
        outcomes = await self._cancel_outcomes(ids, cluster, [r for r in requests if r.end_record])
        if result.returncode != 0:  # scancel found nothing to cancel: the shred after it did not run
            await self.ashred([p for r in requests if not isinstance(outcomes[r.job_id], Exception) for p in r.shred])
        return {r: outcomes[r.job_id] for r in requests}

    async def _outcome_alone(self, request: CancelRequest) -> str | Exception:
        try:
            return (await self.acancel_many([request]))[request]
        except Exception as exc:
            return exc

    async def _cancel_outcomes(
        self, job_ids: Sequence[str], cluster: str | None, with_records: Sequence[CancelRequest] = ()
    ) -> dict[str, str | Exception]:
        """What the scancel that just ran did to each job, from slurmctld's view, else from accounting (else, on a
        cluster without it, from the end records of `with_records`)."""
        outcomes: dict[str, str | Exception] = {}
        squeue = await self.arun(commands.build_squeue_states(job_ids, cluster), check=False)
        if squeue.returncode == 0:
            live = commands.parse_squeue(squeue.text)
            for job_id in job_ids:
                info = live.get(job_id)
                if info is not None:
                    outcomes[job_id] = ENDED if info.state in (JobState.COMPLETE, JobState.ERROR) else CANCELLED
        elif not squeue_job_id_unknown(squeue.error_text):
            raise _unchecked(job_ids, squeue.error_text)
        unknown = [j for j in job_ids if j not in outcomes]
        if not unknown:
            return outcomes
        if await self.aaccounting() is not False:
            sacct = await self.arun(commands.build_sacct_states(unknown, cluster), check=False)
            if sacct.returncode == 0:
                return {**outcomes, **_outcomes_by_accounting(unknown, commands.parse_sacct(sacct.text), squeue.host)}
            if not await self.alearn_accounting(sacct):
                raise _unchecked(unknown, sacct.error_text)
        requests = {r.job_id: r for r in with_records if r.job_id in unknown}
        ended = await self._ended_by_record(list(requests.values()))
        for job_id in unknown:
            request = requests.get(job_id)
            if request is not None and ended[request]:
                outcomes[job_id] = ENDED
                continue
            outcomes[job_id] = NpaCancelFailed(
                f"nothing was cancelled: slurmctld on {squeue.host} does not know Slurm job {job_id} (it forgets an "
                "ended job MinJobAge after its end) and the cluster keeps no accounting; "
                f"{_no_record(request or CancelRequest(job_id))}. Check the job id with `squeue -j {job_id}`."
            )
        return outcomes

    async def acancel_by_name(
        self, job_name: str, *, comment: str, marker: str | None = None, shred: Sequence[str] = ()
    ) -> None:
        """scancel the connection user's jobs named exactly ``job_name`` that carry ``comment`` (the owner proof
        the try submitted them with), creating ``marker`` first.

        For a job whose id is not known yet (sbatch or the reconciliation of an ambiguous submission still in
        flight). Job names carry the deployment, the task instance and the try (`npa_airflow.common.naming`);
        `--user` keeps other users' jobs of the same name out of it, and the comment any other job of this account.
        """
        cfg = await self.aconfig()
        command = commands.build_cancel_by_name(job_name, cfg.user, comment, await self.atarget_cluster())
        if shred:  # the job's sidecar: a cancelled job never runs again
            command = f"{command} || exit $?; {commands.build_shred_files(shred)}"
        result = await self.arun(_recorded(command, marker), check=False)
        _raise_for_scancel(result, f"--name={job_name}")

    async def acancel_origin(self, job_id: str, marker: str | None) -> commands.CancelOrigin:
        """Who cancelled ``job_id``: Airflow (``marker`` exists) or the uid accounting names. On a cluster without
        accounting (learnt from this very answer when not known yet on this connection), only the marker tells."""
        cluster = await self.atarget_cluster()
        if await self.aaccounting() is not False:
            result = await self.arun(commands.build_cancel_origin(job_id, marker, cluster))
            origin = commands.parse_cancel_origin(result.text)
            if origin.sacct_error is None or not await self.alearn_from_sacct_error(result.host, origin.sacct_error):
                return origin
        result = await self.arun(commands.build_cancel_origin(job_id, marker, cluster, accounting=False))
        return commands.parse_cancel_origin(result.text, accounting=False)


def _settled_by_accounting(
    request: CancelRequest, records: Mapping[str, commands.SlurmJobInfo], user: str
) -> str | Exception:
    """A named request whose job slurmctld no longer knows: ENDED if accounting shows it finished, else refused."""
    record = records.get(request.job_id)
    if record is not None and record.job_name == request.job_name and record.state.is_terminal:
        return ENDED
    seen = "has no record of it" if record is None else f"shows {record.job_name} {record.native_state}"
    return _not_this_job(request, f"slurmctld does not know it as a job of user {user}, and accounting {seen}")


def _no_record(request: CancelRequest) -> str:
    if request.end_record is None:
        return "where its end record would be is not known, so whether it ended cannot be told"
    return f"it left no end record at {request.end_record}, so whether it ended cannot be told"


def _outcomes_by_accounting(
    unknown: Sequence[str], records: Mapping[str, commands.SlurmJobInfo], host: str
) -> dict[str, str | Exception]:
    outcomes: dict[str, str | Exception] = {}
    for job_id in unknown:
        record = records.get(job_id)
        if record is not None and record.state.is_terminal:
            outcomes[job_id] = ENDED
            continue
        seen = "has no record of it" if record is None else f"still shows it {record.native_state}"
        outcomes[job_id] = NpaCancelFailed(
            f"nothing was cancelled: slurmctld on {host} does not know Slurm job {job_id} and accounting "
            f"{seen}. Check the job id and the cluster (connection extra cluster_name) with "
            f"`sacct -j {job_id}` and `squeue -j {job_id}`."
        )
    return outcomes
