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
        gpu_per_node="GPU:1",
        entrypoint="ticker.py",
        workdir=str(WORKDIR),
        envs={"NPA_TICKS": "600"},
        infra="slurm/npa-local",
        cluster_name="npa-e2e-burst-ui",
        master_port=29731,  # every "node" of the local cluster is this host: keep off torchrun's default port
        poll_interval=2,
        deadline=900,
        retries=0,
    )
