"""npa_airflow.slurm.submit.fit: requests that can never run, read against recorded scontrol output."""

from __future__ import annotations

from pathlib import Path

import pytest

from npa_airflow.slurm import commands as c
from npa_airflow.slurm.submit.fit import Request, mem_mb_of, misfit, never_clearing_reason

SAMPLES = Path(__file__).parents[1] / "samples" / "22.05"
NODES = c.parse_scontrol_nodes((SAMPLES / "scontrol_nodes.txt").read_text())
PARTS = c.parse_partitions((SAMPLES / "scontrol_partitions.txt").read_text())


@pytest.mark.parametrize(
    ("part", "request_", "fits"),
    [
        ("cpu", Request(nodes=2), True),
        ("gpu", Request(nodes=2, gpus_per_node=8), True),
        ("gpu", Request(nodes=1, gpus_per_node=8, mem_mb=4096), True),
    ],
)
def test_requests_the_partition_can_hold(part, request_, fits):
    assert (misfit(request_, PARTS[part], NODES) is None) is fits


@pytest.mark.parametrize(
    ("part", "request_", "says"),
    [
        ("cpu", Request(nodes=4096), "nodes=4096 but partition 'cpu' has 2 node(s)"),
        ("cpu", Request(nodes=1, gpus_per_node=1), "at most 0 GPU(s) per node"),
        ("gpu", Request(nodes=1, gpus_per_node=16), "at most 8 GPU(s) per node"),
        ("gpu", Request(nodes=1, gpus_per_node=1, mem_mb=8192), "at most 4096 MB (RealMemory)"),
    ],
)
def test_requests_that_can_never_run_are_named(part, request_, says):
    assert says in (misfit(request_, PARTS[part], NODES) or "")


def test_partition_max_nodes():
    limited = PARTS["cpu"].__class__(**{**PARTS["cpu"].__dict__, "max_nodes": 1})
    assert "MaxNodes=1" in (misfit(Request(nodes=2), limited, NODES) or "")


@pytest.mark.parametrize(
    ("reason", "token"),
    [
        ("PartitionConfig", "PartitionConfig"),
        ("BadConstraints", "BadConstraints"),
        ("PartitionNodeLimit", "PartitionNodeLimit"),
        ("Resources", None),
        ("Priority", None),
        ("ReqNodeNotAvail, UnavailableNodes:c1", None),
        ("AssocMaxJobsLimit", None),
        (None, None),
    ],
)
def test_never_clearing_reasons(reason, token):
    assert never_clearing_reason(reason) == token


def test_mem_option():
    assert mem_mb_of(["--qos=x", "--mem=8G"]) == 8192
    assert mem_mb_of(["--mem=500"]) == 500
    assert mem_mb_of(["--mem-per-cpu=1G"]) is None
