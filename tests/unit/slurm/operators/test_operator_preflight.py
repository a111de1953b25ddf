"""SlurmPreflightOperator: the request it builds from the connection."""

from __future__ import annotations

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import (
    SlurmPreflightOperator,
)
from tests.harness.slurm_operator_doubles import CFG_WITH_EXTRAS as CFG


def test_preflight_request_defaults_from_the_connection() -> None:
    op = SlurmPreflightOperator(task_id="p", dataset_paths="lustre:///lustre/data", time_hours=4)
    req = op.build_request(CFG)
    assert req.writable_dirs == (("results_root", "/lustre/results"), ("sqsh_cache_dir", "/lustre/sqsh"))
    assert req.partitions == ("gpu", "cpu_long")
    assert req.dataset_paths == ("lustre:///lustre/data",)
    assert req.time_minutes == 240
    assert req.check_pyxis and req.check_enroot
    bare = SlurmPreflightOperator(task_id="p", containers=False).build_request(CFG)
    assert bare.writable_dirs == (("results_root", "/lustre/results"),)
    assert bare.partitions == ("gpu",)
    assert not bare.check_pyxis and not bare.check_enroot
    with pytest.raises(NpaValidationError, match="relative"):
        SlurmPreflightOperator(task_id="p", dataset_paths=["data"]).build_request(CFG)
