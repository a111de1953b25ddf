"""Deterministic Slurm job names per task-instance try of one deployment.

A name is ``npa-<slug>-<hash10>-t<try>``: the slug keeps it readable in ``squeue``, the hash over
(dag, task, run, map index), keyed by the deployment (`npa_airflow.common.deployment`), makes it unique per task
instance of this deployment (another deployment with the same DAG and run id derives another name), and the try
suffix lets a new try find the jobs of earlier tries by exact name (``-t1`` .. ``-t<try-1>``). Burst uses the same
names, lowercased, for its launches and the clusters it brings up.

Releases before the deployment key hashed the identity alone (`legacy_job_name_for`): a try after the upgrade
still finds the job an earlier try submitted under that name (`npa_airflow.slurm.operators.submission`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING

from npa_airflow.common.checks import fullmatch_or_raise
from npa_airflow.exceptions import NpaValidationError

if TYPE_CHECKING:
    from npa_airflow.common.deployment import Deployment

# Slurm accepts almost anything as a job name; we only ever emit (and accept) a charset that needs no
# quoting anywhere and cannot collide with sacct/squeue list syntax (no commas, spaces or pipes).
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
JOB_NAME_MAX = 128
SLUG_MAX = 40
HASH_LEN = 10


def validate_job_name(name: str, field: str = "job_name") -> str:
    """Return ``name`` if it is a safe Slurm job name, else raise a clear error."""
    return fullmatch_or_raise(
        name,
        JOB_NAME_RE,
        f"{field}={name!r} is not a valid job name: use 1-{JOB_NAME_MAX} characters from "
        "[A-Za-z0-9._-], starting with a letter or digit",
    )


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = slug[:SLUG_MAX].rstrip("-")
    return slug or "job"


def task_instance_hash(dag_id: str, task_id: str, run_id: str, map_index: int | None, *, deployment: Deployment) -> str:
    """10 hex digits of a digest of the task instance's identity, keyed by the deployment."""
    return deployment.digest("ti", dag_id, task_id, run_id, _index(map_index), length=HASH_LEN)


def identity_hash(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> str:
    """10 hex digits of an unkeyed hash of the task instance's identity, the same in every deployment (the names
    of releases before the deployment key; the claim files next to a job's log)."""
    identity = json.dumps([dag_id, task_id, run_id, _index(map_index)], separators=(",", ":"))
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:HASH_LEN]


def _index(map_index: int | None) -> int:
    return -1 if map_index is None else int(map_index)


def _checked_identity(dag_id: str, task_id: str, run_id: str, try_number: int) -> None:
    if not isinstance(try_number, int) or isinstance(try_number, bool) or try_number < 1:
        raise NpaValidationError(f"try_number={try_number!r} must be an integer >= 1")
    for field, value in (("dag_id", dag_id), ("task_id", task_id), ("run_id", run_id)):
        if not isinstance(value, str) or not value:
            raise NpaValidationError(f"{field}={value!r} must be a non-empty string")


def job_name_for(
    dag_id: str, task_id: str, run_id: str, map_index: int | None, try_number: int, *, deployment: Deployment
) -> str:
    """The Slurm job name of one try of one task instance of this deployment (stable across processes)."""
    _checked_identity(dag_id, task_id, run_id, try_number)
    digest = task_instance_hash(dag_id, task_id, run_id, map_index, deployment=deployment)
    return validate_job_name(f"npa-{_slug(f'{dag_id}-{task_id}')}-{digest}-t{try_number}")


def legacy_job_name_for(dag_id: str, task_id: str, run_id: str, map_index: int | None, try_number: int) -> str:
    """The name releases before the deployment key gave this try (looked for once, after the upgrade)."""
    _checked_identity(dag_id, task_id, run_id, try_number)
    digest = identity_hash(dag_id, task_id, run_id, map_index)
    return validate_job_name(f"npa-{_slug(f'{dag_id}-{task_id}')}-{digest}-t{try_number}")


def earlier_try_names(
    dag_id: str, task_id: str, run_id: str, map_index: int | None, try_number: int, *, deployment: Deployment
) -> list[str]:
    """Exact job names of tries 1 .. try_number-1 of the same task instance (oldest first)."""
    job_name_for(dag_id, task_id, run_id, map_index, try_number, deployment=deployment)  # validates the arguments
    return [job_name_for(dag_id, task_id, run_id, map_index, t, deployment=deployment) for t in range(1, try_number)]


def legacy_earlier_try_names(
    dag_id: str, task_id: str, run_id: str, map_index: int | None, try_number: int
) -> list[str]:
    """:func:`earlier_try_names` as releases before the deployment key named them."""
    return [legacy_job_name_for(dag_id, task_id, run_id, map_index, t) for t in range(1, try_number)]


_SEGMENT_SUFFIX = re.compile(r"-s([0-9]{1,4})(?=-t[0-9]+$)")


def segment_of(job_name: str | None) -> int:
    """The segment a job name belongs to: ``...-s3-t1`` is segment 3; a name without the suffix is segment 1."""
    found = _SEGMENT_SUFFIX.search(job_name or "")
    return int(found.group(1)) if found else 1
