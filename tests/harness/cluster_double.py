"""`LocalClusterDouble`: a stand-in for SlurmHook at the boundary, for the poller and trigger tests.

Job states come from a dict the test sets (no Slurm here; the real-cluster coalescing figures come from the sdiag
benchmark), while every shell command the poller builds (log tails, offsets files) runs for real in local bash
against real files.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import JobQuery, JobUsage, SlurmJobInfo
from npa_airflow.slurm.hook import CommandResult

NATIVE = {
    JobState.PENDING: "PENDING",
    JobState.RUNNING: "RUNNING",
    JobState.COMPLETE: "COMPLETED",
    JobState.ERROR: "FAILED",
    JobState.CANCELED: "CANCELLED",
}


def info(
    job_id: str,
    state: JobState,
    exit_code: int | None = None,
    reason: str | None = None,
    usage: JobUsage | None = None,
) -> SlurmJobInfo:
    return SlurmJobInfo(
        job_id=job_id,
        native_state=NATIVE[state],
        state=state,
        exit_code=exit_code,
        signal=None,
        job_name=f"job-{job_id}",
        node_list="c1",
        reason=reason,
        source="sacct",
        usage=usage,
    )


class LocalClusterDouble:
    """Test double for SlurmHook: scripted job states, real local bash for every command string."""

    def __init__(self) -> None:
        self.states: dict[str, JobState] = {}
        self.reasons: dict[str, str] = {}  # Slurm's Reason of a job, as squeue/sacct report it
        self.state_calls: list[list[str]] = []
        self.commands: list[str] = []
        self.fail_states = 0  # next N ajob_states calls raise ConnectionError
        self.fail_commands = 0
        self.shredded: list[str] = []  # files removed through acancel/ashred (the poller shreds through arun)
        self.shred_calls: list[list[str]] = []  # the paths of each ashred call
        self.absent: set[str] = set()  # ids both sacct and squeue answer they do not know
        self.cancel_batches: list[list[str]] = []  # job ids of each acancel_many call
        self.path_checks: list[list[str]] = []  # paths of each apaths_exist call
        self.controller: dict[str, JobState] = {}  # what squeue says, where it differs from sacct (lag)
        self.end_record_calls: list[dict[str, str]] = []  # the end records each state query looked for
        self.pending_calls: list[list[str]] = []  # the ids each state query asked squeue about with its sacct
        self.usage: dict[str, JobUsage] = {}  # what sacct's AllocTRES and ElapsedRaw say of a job
        self.accounting = True  # False: a cluster without accounting (no usage, whatever `usage` holds)

    async def ajob_states(self, job_ids):
        self.state_calls.append(list(job_ids))
        if self.fail_states:
            self.fail_states -= 1
            raise ConnectionError("connection to 127.0.0.1:2222 lost")
        usage = self.usage if self.accounting else {}
        return {
            j: info(j, self.states[j], reason=self.reasons.get(j), usage=usage.get(j))
            for j in job_ids
            if j in self.states
        }

    async def aquery_jobs(self, job_ids, end_records=None, pending=(), end_record_paths=None):
        """`states` is what sacct says; a job in `controller` (what squeue says) whose end record exists locally
        while sacct has no end for it takes squeue's answer when it is COMPLETED, as the hook does. `pending` (the ids
        the poller asks squeue about with the sacct) is recorded in `pending_calls`."""
        states = await self.ajob_states(job_ids)
        self.end_record_calls.append(dict(end_records or {}))
        self.pending_calls.append(list(pending))
        checked = [
            j for j, path in (end_records or {}).items()
            if Path(path).exists() and j in states and not states[j].state.is_terminal
        ]  # fmt: skip
        # squeue's COMPLETED keeps the usage of sacct's RUNNING record, as the hook's does
        early = {
            j: info(j, JobState.COMPLETE, usage=states[j].usage if states[j].state is JobState.RUNNING else None)
            for j in checked
            if self.controller.get(j) is JobState.COMPLETE
        }
        return JobQuery(
            {**states, **early},
            frozenset(j for j in job_ids if j in self.absent and j not in states),
            end_records_checked=frozenset(checked),
            ended_before_accounting=frozenset(early),
            accounting=self.accounting,
        )

    async def arun(self, argv, *, stdin=None, timeout=120, check=True):
        assert isinstance(argv, str)
        self.commands.append(argv)
        if self.fail_commands:
            self.fail_commands -= 1
            raise ConnectionError("connection reset")
        proc = await asyncio.create_subprocess_exec("bash", "-c", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate(stdin)
        return CommandResult(stdout=out, stderr=err, returncode=proc.returncode, host="local")

    async def apath_exists(self, path):
        return (await self.apaths_exist([path]))[path]

    async def apaths_exist(self, paths):
        self.path_checks.append(list(paths))
        return {path: Path(path).exists() for path in paths}

    async def acancel(self, job_id, *, marker=None, shred=()):
        self.states[job_id] = JobState.CANCELED
        await self.ashred(shred)
        return "cancelled"

    async def acancel_many(self, requests):
        """One batch of cancels (the real hook sends one scancel): each through `acancel`, which tests replace."""
        self.cancel_batches.append([r.job_id for r in requests])
        outcomes = {}
        for r in requests:
            kwargs = {"marker": r.marker} if r.marker else {}  # some tests' acancel takes no marker
            outcomes[r] = await self.acancel(r.job_id, shred=r.shred, **kwargs)
        return outcomes

    async def ashred(self, paths):
        self.shred_calls.append(list(paths))
        self.shredded.extend(paths)
        for path in paths:
            Path(path).unlink(missing_ok=True)
