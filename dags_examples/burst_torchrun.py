"""One gang-scheduled multi-node torchrun job on a SkyPilot burst cluster (the seed's `npa burst submit`).

The entrypoint is a single-process command: the generated launcher derives the rendezvous from SkyPilot's
node environment and runs it under torchrun on every node. The task launches from the worker, pushes the
job handle to XCom (`burst_job`), waits in the triggerer while the job log streams into the task log,
and tears the cluster down at the end. Marking the task failed cancels the job and downs the cluster.

Connection `skypilot_default` (type `skypilot`): host = API server endpoint (`dev/skypilot env` prints one
for the local server). Adjust the params for your infra: `gpu_per_node` is per node (`NAME:COUNT`, the
name the cluster advertises); `infra` pins the infra (e.g. `k8s`, `slurm/<cluster>`).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from npa_airflow.burst.operators import BurstTorchrunOperator

with DAG(
    dag_id="burst_torchrun",
    schedule=None,
    catchup=False,
    tags=["npa", "burst", "example"],
    params={
        "image": Param("nvcr.io/nvidia/pytorch:25.01-py3", type="string"),
        "gpu_per_node": Param("H100:8", type="string"),
        "infra": Param(None, type=["null", "string"]),
    },
) as dag:
    BurstTorchrunOperator(
        task_id="train",
        skypilot_conn_id="skypilot_default",
        image="{{ params.image }}",
        nodes=2,
        gpu_per_node="{{ params.gpu_per_node }}",
        entrypoint="python -c 'import torch.distributed as d; d.init_process_group(\"gloo\"); print(d.get_rank())'",
        infra="{{ params.infra or '' }}",
        deadline=timedelta(hours=4),
        retries=0,
    )
