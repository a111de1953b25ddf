"""One gang-scheduled multi-node torchrun job on a SkyPilot burst cluster (the seed's `npa burst submit`).

The command is a single-process command: the generated launcher derives the rendezvous from SkyPilot's
node environment and runs it under torchrun on every node. The task launches from the worker, pushes the
job handle to XCom (`burst_job`), waits in the triggerer while the job log streams into the task log,
and tears the cluster down at the end. Marking the task failed cancels the job and downs the cluster.

Runs as-is on the local stack (`dev/cluster up`, `dev/skypilot up`, `dev/skypilot slurm`): no container
(the local cluster has no Pyxis), the `gpu` partition's fake GPUs (SkyPilot names them "GPU"), and the
all-reduce probe as the command (gloo on CPU). On a real GPU infra, trigger it with e.g.
    {"image": "nvcr.io/nvidia/pytorch:25.01-py3", "accelerators": "H100:8", "infra": "k8s"}
and your own command ("python train.py --config configs/run.yaml").

Connection `skypilot_default` (type `skypilot`): host = API server endpoint (`dev/skypilot env` prints it).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from npa_airflow.burst.operators import BurstTorchrunOperator
from npa_airflow.common.templates import templates_dir

with DAG(
    dag_id="burst_torchrun",
    schedule=None,
    catchup=False,
    tags=["npa", "burst", "example"],
    render_template_as_native_obj=True,  # a null image param stays None (no container)
    params={
        "image": Param(None, type=["null", "string"]),
        "accelerators": Param("GPU:1", type="string"),  # SkyPilot accelerator spec NAME:COUNT, per node
        "infra": Param("slurm/npa-local", type=["null", "string"]),
    },
) as dag:
    BurstTorchrunOperator(
        task_id="train",
        skypilot_conn_id="skypilot_default",
        image="{{ params.image }}",
        nodes=2,
        accelerators="{{ params.accelerators }}",
        command="nccl_allreduce_probe.py",
        workdir=str(templates_dir() / "probe"),
        environment={"NPA_PROBE_COLLECTIVE_TIMEOUT": "300"},
        infra="{{ params.infra }}",
        max_wait=timedelta(hours=4),
        retries=0,
    )
