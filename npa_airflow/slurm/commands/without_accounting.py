"""Job states on a cluster without accounting (no slurmdbd: sacct answers "accounting storage is disabled"), pure.

There, slurmctld is the only one who knows a job's state, and only while it keeps the job: ``squeue -t all``
shows an ended job until MinJobAge (300 s by default) has passed, then forgets it. The exit code of an ended job
is in ``scontrol show job`` meanwhile, and in the job's own end record (its batch script's last write, the exit
code of its program, `npa_airflow.slurm.commands.end_records`) for good. So:
- a job squeue shows: its state; an ended one's exit code from its end record, else from scontrol;
- a job squeue no longer shows, with an end record: exit code 0 is COMPLETED, any other FAILED with that code;
- a job squeue no longer shows, without one: it ended before its script finished (cancelled, timed out, a node
  failure, killed), and how is lost with slurmctld's record. That is an error with that explanation, never a
  success;
- a job squeue no longer shows whose end record is not known (no results directory): absent, as on any cluster.
What a job was allocated and how long it ran is accounting's alone: its usage is unknown here (None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import JobQuery, SlurmJobInfo

SOURCE = "end_record"


def needs_scontrol(info: SlurmJobInfo | None, code: int | None) -> bool:
    """Whether the exit code of a job squeue shows must come from ``scontrol show job``: it failed, and its end
    record holds no exit code (its script did not finish)."""
    return info is not None and info.state is JobState.ERROR and code is None


def gone_without_record(job_id: str, record: str) -> str:
    """Why a job slurmctld forgot, without an end record, counts as failed."""
    return (
        f"slurmctld no longer knows Slurm job {job_id} (it forgets an ended job MinJobAge after its end) and the "
        f"job's batch script left no end record (its exit code) at {record}: the job ended before its script "
        "finished (cancelled, timed out, out of memory, a node failure or killed). This cluster keeps no accounting "
        "(sacct: accounting storage is disabled), so how it ended is not known; see the job's output"
    )


def settle(
    job_ids: Sequence[str],
    live: Mapping[str, SlurmJobInfo],
    end_records: Mapping[str, str],
    codes: Mapping[str, int | None],
    details: Mapping[str, SlurmJobInfo] | None = None,
) -> JobQuery:
    """The states of `job_ids` from squeue's answer (`live`), the end records ({job id: path}) and what they hold
    (`codes`: {path: exit code, None without one} for the records that exist) and scontrol's answers
    (`details`, for the jobs :func:`needs_scontrol` named)."""
    states: dict[str, SlurmJobInfo] = {}
    absent: set[str] = set()
    for job_id in job_ids:
        record = end_records.get(job_id)
        code = codes.get(record) if record else None
        info = live.get(job_id)
        if info is not None:
            states[job_id] = _with_exit_code(info, code, (details or {}).get(job_id))
        elif record is None:
            absent.add(job_id)
        else:
            states[job_id] = _from_record(job_id, record, code)
    return JobQuery(states, frozenset(absent), accounting=False)


def _with_exit_code(info: SlurmJobInfo, code: int | None, detail: SlurmJobInfo | None) -> SlurmJobInfo:
    """squeue's record of a job, with the exit code of an ended one (squeue has none)."""
    if not info.state.is_terminal:
        return info
    if info.state is JobState.COMPLETE:
        return _replace(info, exit_code=0, signal=0)
    if code is not None:
        return _replace(info, exit_code=code, signal=0)
    if detail is not None:
        return _replace(info, exit_code=detail.exit_code, signal=detail.signal)
    return info


def _from_record(job_id: str, record: str, code: int | None) -> SlurmJobInfo:
    if code == 0:
        return SlurmJobInfo(job_id, "COMPLETED", JobState.COMPLETE, 0, 0, None, None, None, SOURCE)
    if code is not None:
        return SlurmJobInfo(job_id, "FAILED", JobState.ERROR, code, 0, None, None, "NonZeroExitCode", SOURCE)
    return SlurmJobInfo(
        job_id, "UNKNOWN", JobState.ERROR, None, None, None, None, gone_without_record(job_id, record), SOURCE
    )


def _replace(info: SlurmJobInfo, **changes: int | None) -> SlurmJobInfo:
    return replace(info, **changes)
