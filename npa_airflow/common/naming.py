"""Deterministic Slurm job names per task-instance try.

A name is ``npa-<slug>-<hash10>-t<try>``: the slug keeps it readable in ``squeue``, the hash over
(dag, task, run, map index) makes it unique per task instance, and the try suffix lets a new try find
the jobs of earlier tries by exact name (``-t1`` .. ``-t<try-1>``). Burst uses the same names, lowercased, for
its launches and the clusters it brings up.
"""

from __future__ import annotations

import hashlib
import json
import re

from npa_airflow.common.checks import fullmatch_or_raise
from npa_airflow.exceptions import NpaValidationError

# Slurm accepts almost anything as a job name; we only ever emit (and accept) a charset that needs no
# quoting anywhere and cannot collide with sacct/squeue list syntax (no commas, spaces or pipes).
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
JOB_NAME_MAX = 128
# What a new try does with a live job of an earlier try: adopt it and wait for it, or cancel it and start anew.
ON_PREVIOUS_TRY = ("reattach", "cancel")
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


def task_instance_hash(dag_id: str, task_id: str, run_id: str, map_index: int | None) -> str:
    """The first 10 hex digits of a SHA-256 over the task instance's identity."""
    index = -1 if map_index is None else int(map_index)
    identity = json.dumps([dag_id, task_id, run_id, index], separators=(",", ":"))
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:HASH_LEN]


def job_name_for(dag_id: str, task_id: str, run_id: str, map_index: int | None, try_number: int) -> str:
    """The Slurm job name of one try of one task instance (stable across processes and restarts)."""
    if not isinstance(try_number, int) or isinstance(try_number, bool) or try_number < 1:
        raise NpaValidationError(f"try_number={try_number!r} must be an integer >= 1")
    for field, value in (("dag_id", dag_id), ("task_id", task_id), ("run_id", run_id)):
        if not isinstance(value, str) or not value:
            raise NpaValidationError(f"{field}={value!r} must be a non-empty string")
    slug = _slug(f"{dag_id}-{task_id}")
    digest = task_instance_hash(dag_id, task_id, run_id, map_index)
    return validate_job_name(f"npa-{slug}-{digest}-t{try_number}")


def earlier_try_names(dag_id: str, task_id: str, run_id: str, map_index: int | None, try_number: int) -> list[str]:
    """Exact job names of tries 1 .. try_number-1 of the same task instance (oldest first)."""
    job_name_for(dag_id, task_id, run_id, map_index, try_number)  # validates the arguments
    return [job_name_for(dag_id, task_id, run_id, map_index, t) for t in range(1, try_number)]
