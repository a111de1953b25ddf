"""The worker side of a job's `secret_env`: the values are registered with this process's secrets masker before
anything the job printed is written here (the non-deferrable wait, the failure message after a deferral). The
operator names the references (`secret_references`) and masks once per process (`mask_job_secrets`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from npa_airflow.common.secret_env import mask_secret_env


def mask_secret_values(refs: Mapping[str, str], values: Iterable[str] | None, log: logging.Logger) -> bool:
    """Register the values of `refs` (resolved now unless given) with this process's secrets masker.

    False when they could not be read: the caller then writes nothing of the job's output it read itself.
    """
    try:
        mask_secret_env(refs, values)
    except Exception as exc:
        log.warning("Could not read the secret_env values to mask them in this log: %s", exc)
        return False
    return True
