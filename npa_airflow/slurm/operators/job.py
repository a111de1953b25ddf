"""What one Slurm job of a task is made of, built without I/O: the prepared job, what preparing it needs from
outside the operator, and the handle that names the submitted job."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.exceptions import NpaValidationError

if TYPE_CHECKING:
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.submit.spec import SbatchSpec
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig


@dataclass(frozen=True)
class PreparedJob:
    """Everything needed to stage and submit one job; built without I/O."""

    job_name: str
    script: str  # the exact sbatch script that is submitted
    script_path: str
    results_dir: str
    stdout_path: str
    stderr_path: str
    mkdirs: tuple[str, ...] = ()
    required_paths: tuple[str, ...] = ()
    files: tuple[Any, ...] = ()  # staging.StagedFile: extra files (e.g. the mode-600 credentials sidecar)
    sbatch_args: tuple[str, ...] = ()
    wall_seconds: float | None = None
    partition: str | None = None  # checked against the cluster's partitions (exists, MaxTime)
    time_minutes: int | None = None
    # What the job asks of each node; checked against the partition's nodes before submitting (None = unchecked).
    nodes: int | None = None
    gpus_per_node: int = 0
    mem_mb: int | None = None
    secret_values: tuple[str, ...] = field(default=(), repr=False)  # must never appear in the script
    env_file: str | None = None  # the secrets sidecar among `files`: removed once the job has ended for good
    owner_comment: str | None = None  # the proof of its owner (sbatch --comment): set for the job a try submits

    @property
    def secret_files(self) -> tuple[str, ...]:
        """What to shred once the job has ended for good: its sidecar, if it has one."""
        return (self.env_file,) if self.env_file else ()

    @classmethod
    def from_spec(cls, spec: Any, script: str, **where: Any) -> PreparedJob:
        """A job whose name, log paths, partition and time limit come from a built spec (conversion, probe)."""
        return cls(
            job_name=spec.job_name,
            script=script,
            stdout_path=spec.stdout_path,
            stderr_path=spec.stderr_path,
            wall_seconds=spec.time_minutes * 60,
            partition=spec.partition,
            time_minutes=spec.time_minutes,
            **where,
        )


@dataclass(frozen=True)
class JobEnvironment:
    """What `prepare_job` needs from outside the operator, read by its caller (connection, resolved secrets)."""

    config: SlurmConnectionConfig
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass
class ThisTry:
    """What one try reads and builds once in this process, shared by rendering, its steps and on_kill.

    `hook` reads the connection on first use and keeps it: the spec, the job and its handle all take that one
    config. `spec` is the spec of the job the try submits, for an operator that builds one when its fields render
    (SlurmSubmitOperator), so that the script shown and the script submitted come from the same build. `job` is the
    current step's prepared job and `handle` its job once known: until then a kill cancels `job` by its name.
    `killed` (on_kill ran: a submission in flight stops where it resumes) and `done` (the outcome is decided: a
    kill cancels nothing any more) are read by the cancels (`operators/cancel.py`).
    """

    identity: tuple[str, str, str, int | None, int]  # dag, task, run, map index, try
    hook: SlurmHook
    spec: SbatchSpec | None = None
    job: PreparedJob | None = None
    handle: SlurmJobHandle | None = None
    killed: bool = False
    done: bool = False

    def hook_for(self, handle: SlurmJobHandle) -> SlurmHook:
        """The hook for commands about `handle`'s job (scancel, sacct and scontrol name the cluster it is on)."""
        return on_job_cluster(self.hook, handle)


def on_job_cluster(hook: SlurmHook, handle: SlurmJobHandle) -> SlurmHook:
    """`hook`, aimed at the cluster `handle`'s job is on."""
    return hook.on_cluster(handle.cluster) if handle.cluster else hook


def results_root_for(cfg: SlurmConnectionConfig, override: str | None, conn_id: str) -> str:
    """The results root on shared storage: the operator's, else the connection's; absolute, no trailing slash."""
    # DAG parse: run-time only
    from npa_airflow.slurm.submit.storage_paths import normalize_storage_path

    root = override or cfg.results_root
    if not root:
        raise NpaValidationError(
            f"results_root is not set and connection {conn_id!r} has no results_root extra: set one of them to an "
            "absolute path on the cluster's shared storage"
        )
    return normalize_storage_path(root, "results_root").rstrip("/")


def handle_for(
    conn_id: str,
    cfg: SlurmConnectionConfig,
    job: PreparedJob,
    job_id: str,
    *,
    try_number: int,
    retry_of: str | None,
    cluster: str | None = None,
    submitted_at: float | None = None,
) -> SlurmJobHandle:
    """The handle of `job` submitted as `job_id` by try `try_number` (log paths with %j/%x resolved).

    `submitted_at` is Slurm's own submit time of an adopted job; a job submitted just now gets the clock's.
    """
    # DAG parse: the handle module is run-time only (the Slurm operators alone)
    from npa_airflow.slurm.handle import SlurmJobHandle

    host, port = cfg.hosts[0]
    return SlurmJobHandle(
        conn_id=conn_id,
        cluster=cluster or cfg.cluster_name,
        job_id=str(job_id),
        job_name=job.job_name,
        login_host=f"{host}:{port}",
        results_dir=job.results_dir,
        stdout_path=job.stdout_path.replace("%j", str(job_id)).replace("%x", job.job_name),
        stderr_path=job.stderr_path.replace("%j", str(job_id)).replace("%x", job.job_name),
        try_number=try_number,
        retry_of=retry_of,
        submitted_at=submitted_at if submitted_at is not None else time.time(),
        env_file=job.env_file,
        script_path=job.script_path,
    )


def fail_task(message: str) -> Exception:
    """An error that fails the task without a retry (retrying cannot help)."""
    return AirflowFailException(message)
