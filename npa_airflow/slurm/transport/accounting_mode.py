"""Whether a cluster keeps accounting, learnt once per connection, and the state query of one that does not.
Mixed into `AsyncSlurmHook`.

A cluster without slurmdbd answers every sacct with "Slurm accounting storage is disabled". The hook learns that
from the first sacct it runs on a connection (as it learns whether squeue has ``--only-job-state``) and runs no
sacct after it: job states come from slurmctld and each job's end record
(:mod:`npa_airflow.slurm.commands.without_accounting`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from npa_airflow.common.remote_errors import sacct_accounting_disabled
from npa_airflow.exceptions import NpaRemoteError
from npa_airflow.slurm import commands
from npa_airflow.slurm.commands import without_accounting
from npa_airflow.slurm.commands.end_records import split_end_record_codes, with_end_record_codes
from npa_airflow.slurm.transport.ssh import loop_pool

if TYPE_CHECKING:
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
    from npa_airflow.slurm.transport.ssh import CommandResult


class AccountingMode:
    """What the hook knows about the cluster's accounting, and its state query without it."""

    aconfig: Callable[[], Awaitable[SlurmConnectionConfig]]
    arun: Callable[..., Awaitable[CommandResult]]
    arun_batch: Callable[..., Awaitable[list[CommandResult]]]
    log: logging.Logger
    slurm_conn_id: str
    _live_answer: Callable[[CommandResult], Any]

    async def aaccounting(self) -> bool | None:
        """Whether the cluster keeps accounting, as learnt on the current connection: False once sacct answered
        that accounting storage is disabled (no slurmdbd), True once it answered; None before either."""
        return loop_pool().accounting.get((await self.aconfig()).pool_key)

    async def alearn_accounting(self, sacct: CommandResult) -> bool:
        """Learn from one sacct answer whether the cluster keeps accounting; True when it says there is none.

        From then on this connection runs no sacct: job states come from slurmctld and the jobs' end records
        (:mod:`npa_airflow.slurm.commands.without_accounting`)."""
        if sacct.returncode == 0:
            loop_pool().accounting[(await self.aconfig()).pool_key] = True
            return False
        return await self.alearn_from_sacct_error(sacct.host, sacct.error_text)

    async def alearn_from_sacct_error(self, host: str, error_text: str) -> bool:
        """What sacct printed when it failed (on `host`): True, and learnt, when it says there is no accounting."""
        if not sacct_accounting_disabled(error_text):
            return False
        pool, key = loop_pool(), (await self.aconfig()).pool_key
        if pool.accounting.get(key) is not False:
            self.log.info(
                "Slurm connection %s: the cluster keeps no accounting (sacct on %s: %s); job states come from "
                "squeue, scontrol and each job's end record",
                self.slurm_conn_id,
                host,
                error_text[-200:],
            )
        pool.accounting[key] = False
        return True

    async def _aquery_without_accounting(
        self, ids: Sequence[str], cluster: str | None, end_records: Mapping[str, str]
    ) -> commands.JobQuery:
        """The states of `ids` on a cluster without accounting: ONE squeue of every job, preceded in the same
        command by what their end records hold; ``scontrol show job`` (one round trip) only for jobs squeue shows
        failed whose record holds no exit code. See :func:`without_accounting.settle`."""
        records = {i: p for i, p in end_records.items() if i in ids and p}
        paths = list(dict.fromkeys(records.values()))
        squeue_argv = commands.build_squeue_states(ids, cluster)
        command = with_end_record_codes(squeue_argv, paths) if paths else squeue_argv
        result = await self.arun(command, check=False)
        codes, text = split_end_record_codes(result.text, paths) if paths else ({}, result.text)
        live = self._live_answer(dataclasses.replace(result, stdout=text.encode()))
        if live is None:
            raise NpaRemoteError(
                f"squeue did not answer on {result.host} (the cluster keeps no accounting: squeue is the only "
                f"source of job states): {result.error_text[-500:]}"
            )
        need = [i for i in ids if without_accounting.needs_scontrol(live.get(i), codes.get(records.get(i, "")))]
        details = await self._ascontrol_jobs(need, cluster) if need else {}
        return without_accounting.settle(ids, live, records, codes, details)

    async def _ascontrol_jobs(self, ids: Sequence[str], cluster: str | None) -> dict[str, commands.SlurmJobInfo]:
        """``scontrol show job`` of each of `ids`, in one round trip: those it still knows."""
        results = await self.arun_batch([commands.build_scontrol_job(i, cluster) for i in ids])
        found = {}
        for job_id, result in zip(ids, results, strict=True):
            info = commands.parse_scontrol_job(result.text) if result.returncode == 0 else None
            if info is not None:
                found[job_id] = info
        return found
