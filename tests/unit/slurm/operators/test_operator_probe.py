"""SlurmNcclProbeOperator: job names per knob set, the gate, parse-time checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import (
    SlurmNcclProbeOperator,
)


def test_probe_job_names_carry_the_knob_index() -> None:
    op = SlurmNcclProbeOperator(task_id="probe")
    ti = SimpleNamespace(dag_id="d", task_id="probe", run_id="r1", map_index=-1, try_number=2)
    name = op.job_name_for_knob_set({"ti": ti}, 1)
    assert name.endswith("-k1-t2") and name.startswith("npa-d-probe-")


def test_probe_gate_returns_no_env_without_touching_the_cluster() -> None:
    op = SlurmNcclProbeOperator(task_id="probe", nodes=1, gpus_per_node=1)
    assert op.execute({}) == {}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"nodes": 0}, "nodes=0"),
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"knob_sets": []}, "non-empty list"),
        ({"knob_sets": [{"MASTER_PORT": "1"}]}, "set by the probe itself"),
    ],
)
def test_probe_rejects_bad_arguments_at_parse_time(kwargs: dict, fragment: str) -> None:
    with pytest.raises(NpaValidationError, match=fragment):
        SlurmNcclProbeOperator(task_id="probe", **kwargs)
