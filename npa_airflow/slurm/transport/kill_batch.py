"""on_kill's remote work for every trigger of one cluster in this triggerer, coalesced.

Marking a DAG run of 1,000 waiting tasks failed makes the triggerer run 1,000 on_kills at once. Each reads its
job's claim and state and then cancels the job: asked one by one, 4,000 SSH commands through one connection.
Here the requests that arrive together share one command per kind (`npa_airflow.common.coalesce`): a claims
read, a sacct, one scancel round trip with its squeue check, and one shred of the secret files of jobs that had
already ended (the API server's listener cancelled them first). Each trigger still decides for itself.
One per cluster: the `kills` of its channel (`npa_airflow.slurm.transport.channel`), which the listener uses too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from npa_airflow.common.coalesce import Coalescer
from npa_airflow.exceptions import NpaRemoteError
from npa_airflow.slurm.commands.offsets import build_read_claims, parse_read_claims
from npa_airflow.slurm.transport.cancels import CancelRequest

if TYPE_CHECKING:
    from npa_airflow.common.ownership import Claim
    from npa_airflow.slurm.commands import SlurmJobInfo


class KillBatch:
    """Claims, job states and cancels for one cluster's hook, each kind in one command per batch."""

    def __init__(self, hook: Callable[[], Any]) -> None:
        self._hook = hook
        self.claims: Coalescer[str, Claim] = Coalescer(self._read_claims)
        self.states: Coalescer[str, SlurmJobInfo] = Coalescer(self._job_states)
        self.cancels: Coalescer[CancelRequest, str | Exception] = Coalescer(self._cancel_jobs)
        self.shreds: Coalescer[str, bool] = Coalescer(self._shred_files)

    async def read_claim(self, claim_file: str) -> Claim | None:
        """The claim now in `claim_file` (None: missing, empty or damaged)."""
        return await self.claims.get(claim_file)

    async def job_state(self, job_id: str) -> SlurmJobInfo | None:
        """What sacct (squeue for jobs accounting does not know yet) says of `job_id`; None: neither knows it."""
        return await self.states.get(job_id)

    async def cancel(self, request: CancelRequest) -> str:
        """`AsyncSlurmHook.acancel` of one job, in a batch: CANCELLED or ENDED, else its exception."""
        outcome = await self.cancels.get(request)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is None:
            raise NpaRemoteError(f"no answer about the cancel of Slurm job {request.job_id}")
        return outcome

    async def shred(self, paths: Sequence[str]) -> None:
        """`AsyncSlurmHook.ashred` of one job's files, in a batch; raises when the batch's command failed."""
        await asyncio.gather(*(self.shreds.get(path) for path in paths))

    async def _read_claims(self, files: Sequence[str]) -> dict[str, Claim | None]:
        result = await self._hook().arun(build_read_claims(files), timeout=30, check=False)
        if result.returncode is None:
            raise NpaRemoteError("reading the job claims got no exit status")
        return parse_read_claims(result.stdout.split(b"\n", 1)[0], files)

    async def _job_states(self, job_ids: Sequence[str]) -> dict[str, SlurmJobInfo]:
        return await self._hook().ajob_states(job_ids)

    async def _shred_files(self, paths: Sequence[str]) -> dict[str, bool]:
        await self._hook().ashred(paths)
        return dict.fromkeys(paths, True)

    async def _cancel_jobs(self, requests: Sequence[CancelRequest]) -> dict[CancelRequest, str | Exception]:
        return await self._hook().acancel_many(requests)
