"""Defaults the operators share with the site's Airflow settings."""

from __future__ import annotations

import os


def default_deferrable() -> bool:
    """Deferrable unless ``[operators] default_deferrable`` is explicitly set false in the environment.

    Airflow's stock default for that option is false and ``airflow.cfg`` writes it out verbatim, so only an
    explicit environment setting is taken as the site's choice: a job that waits hours for GPUs must not
    hold a worker slot by default.
    """
    raw = os.environ.get("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE")
    if raw is None:
        return True
    return raw.strip().lower() in ("1", "true", "t", "yes", "y", "on")
