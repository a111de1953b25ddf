"""The Slurm job handle: everything needed to find, watch, tail and cancel one submitted job.

It travels as JSON (XCom key ``slurm_job``, trigger kwargs), so ``from_dict`` validates every field:
a handle read back from XCom or a trigger row is as trustworthy as one built in-process.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from npa_airflow.common.checks import field_mismatch, fullmatch_or_raise
from npa_airflow.common.naming import validate_job_name
from npa_airflow.exceptions import NpaValidationError

# A Slurm job id as sbatch prints it: plain, array task (123_4) or heterogeneous component (123+1).
JOB_ID_RE = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,6})?")
CLUSTER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a Slurm cluster name (-M)
# The file a job's batch script writes as its last act (templates/slurm; commands/end_records.py reads it).
END_RECORD_NAME = "child_exit_code"
_HOST_RE = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,255}")
_CONN_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,250}")


def end_record_for(results_dir: str | None) -> str | None:
    """Where the batch script of a job with this results directory writes its end record."""
    return f"{results_dir.rstrip('/')}/{END_RECORD_NAME}" if results_dir else None


def _check_path(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\x00\n\r"):
        raise NpaValidationError(f"SlurmJobHandle.{name}={value!r} must be an absolute path without NUL or newline")


@dataclass(frozen=True)
class SlurmJobHandle:
    conn_id: str
    cluster: str | None  # set for multi-cluster sites (sbatch printed "id;cluster"): -M on every command
    job_id: str
    job_name: str
    login_host: str  # the login host that ran sbatch
    results_dir: str
    stdout_path: str  # concrete paths (no %x/%j patterns): the operator creates their directory
    stderr_path: str
    try_number: int
    retry_of: str | None = None  # the job id of the earlier try this one replaces, if any
    submitted_at: float | None = None  # epoch seconds: when Slurm accepted the job (kept across reattaches)
    # The job's mode-600 secrets sidecar: kept while Slurm may run the job again (requeue), removed once it ended.
    env_file: str | None = None
    script_path: str | None = None  # the submitted script; Airflow's cancel marker sits next to it
    # The try that published this handle to XCom and waits on the job (a later try that adopts the job publishes
    # it again with its own number): a trigger's on_kill tells a clear from a move by it.
    waiting_try: int | None = None

    @property
    def secret_files(self) -> tuple[str, ...]:
        """What to shred once the job has ended for good: its sidecar, if it has one."""
        return (self.env_file,) if self.env_file else ()

    @property
    def end_record(self) -> str | None:
        """Where the job's batch script writes its end record (`npa_airflow.slurm.commands.end_records`)."""
        return end_record_for(self.results_dir)

    def __post_init__(self) -> None:
        fullmatch_or_raise(
            self.conn_id, _CONN_ID_RE, f"SlurmJobHandle.conn_id={self.conn_id!r} is not a valid connection id"
        )
        if self.cluster is not None:
            fullmatch_or_raise(
                self.cluster, CLUSTER_RE, f"SlurmJobHandle.cluster={self.cluster!r} is not a valid Slurm cluster name"
            )
        for name in ("job_id", "retry_of"):
            value = getattr(self, name)
            if value is not None or name == "job_id":
                fullmatch_or_raise(value, JOB_ID_RE, f"SlurmJobHandle.{name}={value!r} is not a Slurm job id")
        validate_job_name(self.job_name, "SlurmJobHandle.job_name")
        fullmatch_or_raise(
            self.login_host, _HOST_RE, f"SlurmJobHandle.login_host={self.login_host!r} is not a host name"
        )
        for name in ("results_dir", "stdout_path", "stderr_path"):
            _check_path(name, getattr(self, name))
        for name in ("env_file", "script_path"):
            if getattr(self, name) is not None:
                _check_path(name, getattr(self, name))
        for name in ("try_number", "waiting_try"):
            value = getattr(self, name)
            if (value is not None or name == "try_number") and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise NpaValidationError(f"SlurmJobHandle.{name}={value!r} must be an integer >= 1")
        if self.submitted_at is not None and (
            isinstance(self.submitted_at, bool)
            or not isinstance(self.submitted_at, (int, float))
            or not math.isfinite(self.submitted_at)
        ):
            raise NpaValidationError(f"SlurmJobHandle.submitted_at={self.submitted_at!r} must be epoch seconds")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (str, int, float, None only) that :meth:`from_dict` reads back.

        `env_file` and `waiting_try` are left out when unset: such a handle keeps its earlier shape.
        """
        data = asdict(self)
        for name in ("env_file", "waiting_try"):
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: object) -> SlurmJobHandle:
        if not isinstance(data, dict):
            raise NpaValidationError(f"a Slurm job handle must be a dict, got {type(data).__name__}: {data!r}")
        optional = ("retry_of", "submitted_at", "env_file", "script_path", "waiting_try")
        required = sorted(f.name for f in fields(cls) if f.name not in optional)
        unknown, missing = field_mismatch(cls, data, required)
        if unknown:
            known = sorted(f.name for f in fields(cls))
            raise NpaValidationError(f"Slurm job handle has unknown keys {unknown}; known keys are {known}")
        if missing:
            raise NpaValidationError(f"Slurm job handle is missing {missing}: {data!r}")
        return cls(**data)
