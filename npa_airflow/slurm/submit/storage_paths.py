"""Paths on a cluster's shared storage, as operators and specs take them (pure).

``lustre:///abs/path`` and ``/abs/path`` name the same place; local paths of the Airflow machine and object
stores are refused, each with the fix.
"""

from __future__ import annotations

import re

from npa_airflow.exceptions import NpaValidationError

STORAGE_SCHEMES = ("lustre://", "slurm://")


def normalize_storage_path(path: object, field_name: str = "path") -> str:
    """A cluster shared-storage path: ``lustre:///abs/path`` or ``/abs/path`` -> ``/abs/path``.

    Local paths of the Airflow machine (relative, ``file://``) and object stores (``s3://`` ...) are
    refused: a Slurm job can only read what its compute nodes see, and fetching a dataset inside the GPU
    allocation burns it (stage the data onto shared storage first).
    """
    if not isinstance(path, str) or not path.strip():
        raise NpaValidationError(f"{field_name}={path!r} must be a non-empty path on the cluster's shared storage")
    if "\x00" in path or "\n" in path or "\r" in path:
        raise NpaValidationError(f"{field_name}={path!r} contains a NUL or newline character")
    for scheme in STORAGE_SCHEMES:
        if path.startswith(scheme):
            rest = path[len(scheme) :]
            if not rest.startswith("/"):
                raise NpaValidationError(
                    f"{field_name}={path!r} names a host; write {scheme}/absolute/path (three slashes)"
                )
            return rest
    if path.startswith("file:"):
        raise NpaValidationError(
            f"{field_name}={path!r} is a file on the Airflow machine, which compute nodes cannot read: copy it "
            "to the cluster's shared storage and pass lustre:///absolute/path"
        )
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path):
        raise NpaValidationError(
            f"{field_name}={path!r}: Slurm job inputs must be on the cluster's shared filesystem, not fetched "
            "inside the GPU allocation; stage the data first and pass lustre:///absolute/path"
        )
    if not path.startswith("/"):
        raise NpaValidationError(
            f"{field_name}={path!r} is relative (local to the Airflow machine); pass an absolute shared path "
            "such as lustre:///absolute/path"
        )
    return path
