"""`secret_env` references: moved to `npa_airflow.common.secret_env` (Slurm and Burst read them alike)."""

from __future__ import annotations

from npa_airflow.common.secret_env import (
    amask_secret_env,
    mask_secret_env,
    resolve_secret_env,
    validate_secret_env,
)

__all__ = ["amask_secret_env", "mask_secret_env", "resolve_secret_env", "validate_secret_env"]
