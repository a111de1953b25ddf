"""A 2-node burst job on SkyPilot's Slurm infra on the local cluster (dev/cluster + dev/skypilot slurm).

No container (image=None: the local cluster has no Pyxis) and the fake GPUs of the `gpu` partition
(SkyPilot names untyped gres "GPU"). The entrypoint is the Slurm side's all-reduce probe, run under the
generated torchrun launcher: gloo on CPU, one process per node.
"""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG

from npa_airflow.burst.operators import BurstTorchrunOperator

REPO = Path(__file__).resolve().parents[3]

with DAG("npa_burst_slurm_allreduce", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False) as dag:
    BurstTorchrunOperator(
        task_id="allreduce",
        image=None,
        nodes=2,
        accelerators="GPU:1",
        command="nccl_allreduce_probe.py",
        workdir=str(REPO / "templates" / "probe"),
        environment={"NPA_PROBE_COLLECTIVE_TIMEOUT": "120"},
        infra="slurm/npa-local",
        cluster_name="npa-e2e-allreduce",
        master_port=29721,  # every "node" of the local cluster is this host: keep off torchrun's default port
        poll_interval=2,
        max_wait=900,
        retries=0,
    )

with DAG("npa_burst_slurm_deadline", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False) as late:
    BurstTorchrunOperator(
        task_id="sleeper",
        image=None,
        nodes=2,
        accelerators="GPU:1",
        command="python3 -c 'import time; time.sleep(900)'",
        infra="slurm/npa-local",
        cluster_name="npa-e2e-deadline",
        master_port=29722,
        poll_interval=2,
        max_wait=120,
        retries=0,
    )
