"""Fixtures for the security suite: one pooled SlurmHook and a private scratch directory on the cluster."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from npa_airflow.slurm.hook import SlurmHook


@pytest.fixture(scope="module")
def pooled_hook(slurm_cluster) -> SlurmHook:
    """The sync facade: every call of the module shares ONE SSH connection on the hook's background loop."""
    return SlurmHook("slurm_default")


@pytest.fixture(scope="module")
def scratch(slurm_cluster, pooled_hook) -> Iterator[str]:
    """A fresh directory on the cluster's shared storage, removed afterwards."""
    path = f"{slurm_cluster.shared}/tests/security-{uuid.uuid4().hex[:10]}"
    pooled_hook.run(["mkdir", "-p", path])
    yield path
    pooled_hook.run(["rm", "-rf", "--", path], check=False)
