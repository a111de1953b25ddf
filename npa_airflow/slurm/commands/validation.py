"""Checks on every job id, cluster, job name and path before it reaches a remote command."""

from __future__ import annotations

from collections.abc import Iterable

from npa_airflow.common.checks import fullmatch_or_raise
from npa_airflow.common.naming import validate_job_name
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.handle import CLUSTER_RE, JOB_ID_RE


def validate_job_id(job_id: object, field: str = "job_id") -> str:
    """123, 123_4 (array task), 123+0 (het component); pending ranges like 123_[1-5] are parsed, never sent."""
    message = f"{field}={job_id!r} is not a Slurm job id (digits, an array task '123_4' or a het component '123+0')"
    return fullmatch_or_raise(job_id, JOB_ID_RE, message)


def validate_cluster(cluster: object, field: str = "cluster") -> str:
    return fullmatch_or_raise(
        cluster, CLUSTER_RE, f"{field}={cluster!r} is not a valid Slurm cluster name ([A-Za-z0-9_.-])"
    )


def validate_remote_path(path: object, field: str = "path") -> str:
    """An absolute path with no NUL or newline (it is always quoted on the way out)."""
    if not isinstance(path, str) or not path:
        raise NpaValidationError(f"{field}={path!r} must be a non-empty absolute path")
    if "\x00" in path or "\n" in path or "\r" in path:
        raise NpaValidationError(f"{field}={path!r} contains a NUL or newline character; choose another path")
    if not path.startswith("/"):
        raise NpaValidationError(f"{field}={path!r} must be absolute (start with '/') on the cluster")
    return path


def job_id_list(job_ids: Iterable[str]) -> str:
    ids = [validate_job_id(j) for j in job_ids]
    if not ids:
        raise NpaValidationError("job_ids is empty: give at least one Slurm job id")
    return ",".join(dict.fromkeys(ids))


def name_list(names: Iterable[str]) -> str:
    checked = [validate_job_name(n, "names") for n in names]
    if not checked:
        raise NpaValidationError("names is empty: give at least one job name")
    return ",".join(dict.fromkeys(checked))


def cluster_args(cluster: str | None) -> list[str]:
    return [] if cluster is None else ["-M", validate_cluster(cluster)]
