"""Test DAG for the Burst e2e test: a 2-node torchrun job on SkyPilot's Slurm infra on the local cluster.

Rank 0 prints "tick <i> of <n>" once a second, long enough to be cancelled from the UI.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from npa_airflow.burst.operators import BurstTorchrunOperator

WORKDIR = Path(__file__).resolve().parents[1] / "burst_workdir"

with DAG(dag_id="npa_e2e_burst", schedule=None, catchup=False, tags=["npa-e2e"]):
    BurstTorchrunOperator(
        task_id="burst",
        image=None,  # the local cluster has no container runtime
        nodes=2,
        accelerators="GPU:1",
        command="ticker.py",
        workdir=str(WORKDIR),
        environment={"NPA_TICKS": "600"},
        infra="slurm/npa-local",
        cluster_name="npa-e2e-burst-ui",
        master_port=29731,  # every "node" of the local cluster is this host: keep off torchrun's default port
        poll_interval=2,
        max_wait=900,
        retries=0,
    )

# The production-shape stall test (tests/e2e/test_production_burst_stall.py): a shorter job on a pinned
# cluster that the test keeps between its runs and takes down at the end.
with DAG(dag_id="npa_e2e_burst_stall", schedule=None, catchup=False, params={"ticks": 60}, tags=["npa-e2e"]):
    BurstTorchrunOperator(
        task_id="burst",
        image=None,
        nodes=2,
        accelerators="GPU:1",
        command="ticker.py",
        workdir=str(WORKDIR),
        environment={"NPA_TICKS": "{{ params.ticks }}"},
        infra="slurm/npa-local",
        cluster_name="npa-e2e-burst-stall",
        teardown="keep",
        master_port=29741,
        poll_interval=2,
        max_wait=900,
        retries=0,
    )
