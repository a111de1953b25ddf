"""What sbatch, sacct, squeue, scontrol and the log tail answer, as records, and the output formats asked of them.

The formats are shared by the builders (which ask for them) and the parsers (which read them).
"""

from __future__ import annotations

from dataclasses import dataclass

from npa_airflow.common.states import JobState
from npa_airflow.common.usage import JobUsage  # what the state query reads of a job

# JobName goes last and the parser splits at most len-1 times, so a '|' in a foreign job name cannot
# shift columns. Reason values are scheduler tokens (no '|'), AllocTRES is "name=count" pairs joined by ','.
_SACCT_STATE = ("JobIDRaw", "JobID", "State", "ExitCode", "NodeList", "Reason")
# The state query also reads what the job was given and how long it ran (JobUsage), in the same sacct. Without
# --duplicates sacct prints one record per job, its last run's: a job Slurm requeued counts that run only.
SACCT_FIELDS = (*_SACCT_STATE, "ElapsedRaw", "AllocTRES", "JobName")
# squeue: %i display id (123_4, 123+0), %A raw id, %T extended state, %r reason, %N nodes, %j name.
SQUEUE_FIELDS = ("%i", "%A", "%T", "%r", "%N", "%j")
SQUEUE_FORMAT = "|".join(SQUEUE_FIELDS)
# Name lookups also read when a job was submitted (epoch seconds under SLURM_TIME_FORMAT=%s) and its comment, the
# proof of its owner (`npa_airflow.common.deployment`); the comment comes last, so it may hold any character.
FIND_SACCT_FIELDS = (*_SACCT_STATE, "JobName", "Submit", "Comment")  # no usage: an owner check needs none
FIND_SQUEUE_FIELDS = (*SQUEUE_FIELDS, "%V", "%k")

# First line of a squeue that checks for --only-job-state itself: "NPA-SQUEUE-FORM only-job-state" or "... full".
SQUEUE_FORM_MARK = "NPA-SQUEUE-FORM"

# Log tail frames: per request a header "NPA-TAIL <index> <size>" then one line of base64, then an end line.
TAIL_MARK = "NPA-TAIL"
TAIL_END = "NPA-TAIL-END"
BATCH_MARK = "NPA-BATCH"  # frames one command of build_batch: "NPA-BATCH <index> <exit status>"
BATCH_END = "NPA-BATCH-END"

# Lines of the cancel-origin command (builders.build_cancel_origin).
CANCEL_BY_AIRFLOW = "NPA_CANCEL_BY_AIRFLOW"
CANCEL_STATE = "NPA_CANCEL_STATE"
CANCEL_USER = "NPA_CANCEL_USER"
CANCEL_SACCT_ERROR = "NPA_CANCEL_SACCT_ERROR"  # why sacct printed no state (e.g. accounting storage is disabled)


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    cluster: str | None


@dataclass(frozen=True)
class SlurmJobInfo:
    job_id: str  # as Slurm displays it: "123", "123_4" (array task), "123+0" (het component)
    native_state: str  # normalised first word: "CANCELLED by 0" -> "CANCELLED"
    state: JobState
    exit_code: int | None  # None until the job is terminal (and always from squeue)
    signal: int | None
    job_name: str | None
    node_list: str | None
    reason: str | None
    source: str  # "sacct" | "squeue" | "scontrol" | "end_record" (a cluster without accounting)
    # Read by name lookups only: the job's comment (None: empty, or accounting does not store comments) and
    # Slurm's submit time (epoch seconds).
    comment: str | None = None
    submitted_at: float | None = None
    # sacct's state query only: None is unknown (squeue, scontrol and end records do not say; nor a name lookup)
    usage: JobUsage | None = None


@dataclass(frozen=True)
class JobQuery:
    """One state query: the jobs found, and the ids that sacct and squeue both answered they do not know."""

    states: dict[str, SlurmJobInfo]
    absent: frozenset[str] = frozenset()
    end_records_checked: frozenset[str] = frozenset()  # ids asked about because their end record exists
    ended_before_accounting: frozenset[str] = frozenset()  # of those, the ids squeue settled as COMPLETED
    accounting: bool = True  # False: the cluster keeps none (states from squeue, scontrol, end records; no usage)


@dataclass(frozen=True)
class CancelOrigin:
    """Who cancelled a job: Airflow (its marker exists), or the uid in sacct's "CANCELLED by <uid>"."""

    by_airflow: bool
    state: str  # sacct's State, e.g. "CANCELLED by 0" ("" when accounting has no record); squeue's without it
    uid: str | None = None
    user: str | None = None
    accounting: bool = True  # False: the cluster keeps no accounting, so no uid is recorded
    sacct_error: str | None = None  # sacct's first error line when it printed no state

    def describe(self) -> str:
        if self.by_airflow:
            return "by Airflow"
        if not self.accounting:
            return (
                f"outside Airflow (Slurm: {self.state or 'no longer known'}; this cluster keeps no accounting, so "
                "who cancelled it is not recorded)"
            )
        if self.uid is None:
            return f"outside Airflow (sacct: {self.state or 'no record'})"
        return f"outside Airflow by uid {self.uid}" + (f" ({self.user})" if self.user else "")


@dataclass(frozen=True)
class LogChunk:
    path: str
    data: bytes
    offset: int  # the new offset: request offset + len(data)
    size: int  # file size when read; -1 = the file does not exist (yet)

    @property
    def missing(self) -> bool:
        return self.size < 0


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # as scontrol prints it, e.g. "IDLE", "MIXED", "DOWN*", "IDLE+DRAIN"
    partitions: tuple[str, ...]
    reason: str | None
    gpus: int = 0  # GPUs in Gres (gpu:8, gpu:a100:4(S:0-1), ...); 0 = none
    real_memory_mb: int | None = None  # RealMemory; None = not reported


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    max_time_minutes: int | None  # None = UNLIMITED
    default: bool
    state: str
    nodes: str | None
    total_nodes: int | None = None  # TotalNodes
    max_nodes: int | None = None  # MaxNodes per job; None = UNLIMITED
