"""The state queries of `AsyncSlurmHook`: what Slurm says of many jobs in as few round trips as it takes (one
sacct, a squeue of the pending ones in the same round trip, at most one more squeue for what the sacct cannot
settle), the jobs of a try found by name, and when a job was submitted. Mixed into `AsyncSlurmHook`.

Which tool answers what, and why, is in :meth:`JobQueries.aquery_jobs`; a cluster without accounting is queried by
:class:`npa_airflow.slurm.transport.accounting_mode.AccountingMode`; the commands and their parsers are
:mod:`npa_airflow.slurm.commands`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from npa_airflow.common.coalesce import Coalescer
from npa_airflow.common.naming import validate_job_name
from npa_airflow.common.remote_errors import squeue_job_id_unknown
from npa_airflow.exceptions import NpaRemoteError
from npa_airflow.slurm import commands
from npa_airflow.slurm.commands.end_records import ended_before_accounting, split_end_records, with_end_records
from npa_airflow.slurm.transport.ssh import loop_pool

# Job names per sacct and per squeue of a shared lookup by name: about 12 KB of command each.
NAMES_PER_LOOKUP = 200

if TYPE_CHECKING:
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
    from npa_airflow.slurm.transport.ssh import CommandResult


@dataclasses.dataclass
class _Answers:
    """What one state query has gathered so far, as its squeues answer."""

    found: dict[str, commands.SlurmJobInfo]
    answered: set[str] = dataclasses.field(default_factory=set)  # ids a squeue answered for (with them or without)
    live: dict[str, commands.SlurmJobInfo] = dataclasses.field(default_factory=dict)
    ran: list[CommandResult] = dataclasses.field(default_factory=list)  # each squeue that ran

    def take_live(self, answer: dict[str, commands.SlurmJobInfo] | None, asked: Sequence[str]) -> None:
        if answer is not None:
            self.answered.update(asked)
            self.live.update(answer)


class JobQueries:
    """Job states, lookups by name and submit times (the hook supplies the attributes declared here)."""

    aconfig: Callable[[], Awaitable[SlurmConnectionConfig]]
    arun: Callable[..., Awaitable[CommandResult]]
    arun_batch: Callable[..., Awaitable[list[CommandResult]]]
    aread_together: Callable[..., Awaitable[list[CommandResult]]]
    atarget_cluster: Callable[[], Awaitable[str | None]]
    aaccounting: Callable[[], Awaitable[bool | None]]
    alearn_accounting: Callable[[CommandResult], Awaitable[bool]]
    _aquery_without_accounting: Callable[..., Awaitable[commands.JobQuery]]

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
        accounting does (npa_airflow.slurm.commands.end_records). The other ids sacct cannot settle (unknown to it, or
        ended in a state Slurm requeues from) get a second squeue after it: a pure state check, with
        ``--only-job-state`` where the login host's squeue has it (learnt once per connection). At most one sacct
        and two squeues.

        On a cluster without accounting (learnt from sacct's answer once per connection) no sacct runs: ONE
        squeue reads every job, with the end records of `end_record_paths` ({job id: path}, every job whose
        record is known) in the same command (:meth:`_aquery_without_accounting`).
        """
        ids = list(dict.fromkeys(job_ids))
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return commands.JobQuery({})
        cluster = await self.atarget_cluster()
        all_records = {**(end_records or {}), **(end_record_paths or {})}
        if await self.aaccounting() is False:
            return await self._aquery_without_accounting(ids, cluster, all_records)
        records = {i: p for i, p in (end_records or {}).items() if i in ids and p}
        wanted = set(pending)
        live_ids = [i for i in ids if i in wanted]
        sacct, squeue = await self._sacct_round(ids, cluster, records, live_ids)
        if sacct.returncode != 0 and await self.alearn_accounting(sacct):
            return await self._aquery_without_accounting(ids, cluster, all_records)
        return await self._settle(ids, cluster, records, (sacct, squeue), live_ids)

    async def _sacct_round(
        self, ids: Sequence[str], cluster: str | None, records: Mapping[str, str], live_ids: Sequence[str]
    ) -> tuple[CommandResult, CommandResult | None]:
        """The first round trip: the sacct (with the end-record tests), and the squeue of `live_ids` if any."""
        sacct_argv = commands.build_sacct_states(ids, cluster)
        command = with_end_records(sacct_argv, list(records.values())) if records else sacct_argv
        if live_ids:
            sacct, squeue = await self.arun_batch([command, commands.build_squeue_states(live_ids, cluster)])
            return sacct, squeue
        return await self.arun(command, check=False), None

    async def _settle(
        self,
        ids: Sequence[str],
        cluster: str | None,
        records: Mapping[str, str],
        first: tuple[CommandResult, CommandResult | None],
        live_ids: Sequence[str],
    ) -> commands.JobQuery:
        """The first round trip's answers, a second squeue for the ids they leave open, and the query's result."""
        sacct, squeue = first
        seen, sacct_text = split_end_records(sacct.text, list(records.values())) if records else ({}, sacct.text)
        accounted = commands.parse_sacct(sacct_text) if sacct.returncode == 0 else {}
        got = _Answers(dict(accounted))
        if squeue is not None:
            got.ran.append(squeue)
            answer = self._live_answer(squeue)
            if answer is not None:
                got.found = commands.merge_pending_states(got.found, answer, live_ids)
            got.take_live(answer, live_ids)
        # Not yet ended for accounting: RUNNING, or still PENDING when slurmdbd stalled before the job's start.
        unsettled = {i for i, info in accounted.items() if not info.state.is_terminal}
        ending = [i for i, path in records.items() if seen.get(path) and i in unsettled]
        asked = [
            i
            for i in ids
            if i not in got.answered and (i not in accounted or commands.may_run_again(accounted[i]) or i in ending)
        ]
        if asked:
            check, second = await self._squeue_states_only(asked, cluster)
            got.ran.append(check)
            got.found = commands.merge_live_states(got.found, second, asked)
            got.take_live(second, asked)
        if sacct.returncode != 0 and got.ran and not got.answered:
            errors = "; ".join(f"squeue: {result.error_text[-500:]}" for result in got.ran)
            raise NpaRemoteError(
                f"neither sacct nor squeue answered on {sacct.host}: sacct: {sacct.error_text[-500:]}; {errors}"
            )
        early = ended_before_accounting(accounted, got.live, [i for i in ending if i in got.answered])
        got.found.update(early)
        states = {i: got.found[i] for i in ids if i in got.found}
        answered_by_all = got.answered if sacct.returncode == 0 else set()
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

    async def afind_jobs_by_name(self, names: Sequence[str]) -> list[commands.SlurmJobInfo]:
        """The connection user's jobs whose name is exactly one of ``names``, from squeue (live) and sacct
        (accounted), merged by id, with their comment and submit time (who owns each: `common.deployment`).

        Lookups that callers on this loop make meanwhile share one sacct and one squeue (per NAMES_PER_LOOKUP
        names): a triggerer starting hundreds of tasks looks them all up in a round trip or two, where one sacct
        each took about 0.1 s of slurmdbd's time, one after the other."""
        names = [validate_job_name(name, "names") for name in dict.fromkeys(names)]
        if not names:
            return []
        cluster = await self.atarget_cluster()
        config = await self.aconfig()
        pool, key = loop_pool(), (config.pool_key, cluster, config.user)
        lookups = pool.name_lookups.get(key)
        if lookups is None:  # gather=0: a lone lookup waits for nobody; those that come while one runs go together
            lookups = pool.name_lookups[key] = Coalescer(
                functools.partial(self._find_by_names, cluster, config.user), gather=0.0
            )
        answers = await asyncio.gather(*(lookups.get(name) for name in names))
        return [info for infos in answers for info in infos or ()]

    async def _find_by_names(
        self, cluster: str | None, user: str, names: list[str]
    ) -> dict[str, list[commands.SlurmJobInfo]]:
        """{name: its jobs} for every name, read in one round trip (raises when neither tool answered)."""
        chunks = [names[i : i + NAMES_PER_LOOKUP] for i in range(0, len(names), NAMES_PER_LOOKUP)]
        accounting = await self.aaccounting() is not False  # without accounting, slurmctld's view is all there is
        reads = []
        for chunk in chunks:
            if accounting:
                reads.append(commands.build_find_by_name_sacct(chunk, user, cluster))
            reads.append(commands.build_find_by_name_squeue(chunk, user, cluster))
        results = iter(await self.aread_together(reads))
        found: dict[str, commands.SlurmJobInfo] = {}
        for _ in chunks:
            sacct = next(results) if accounting else None
            squeue = next(results)
            if sacct is not None and sacct.returncode == 0:
                found.update(commands.parse_sacct(sacct.text, commands.FIND_SACCT_FIELDS))
            if sacct is not None:
                await self.alearn_accounting(sacct)
            if squeue.returncode == 0:  # the live view wins over accounting's lag, and it always has the comment
                found.update(commands.parse_squeue(squeue.text, commands.FIND_SQUEUE_FIELDS))
            if (sacct is None or sacct.returncode != 0) and squeue.returncode != 0:
                raise NpaRemoteError(f"could not look up jobs by name on {squeue.host}: {squeue.error_text[-500:]}")
        by_name: dict[str, list[commands.SlurmJobInfo]] = {name: [] for name in names}
        for info in found.values():
            if info.job_name in by_name:
                by_name[info.job_name].append(info)
        return by_name
