"""Submit a 2-node Slurm job and wait for it without holding a worker slot.

Runs as-is on the local CPU test cluster (`dev/cluster up`; partition `cpu`, no GPUs). Each node prints
the rendezvous variables the sbatch template exports (WORLD_SIZE = node count, NUM_GPU_PER_NODE,
NODE_RANK = $SLURM_NODEID, MASTER_ADDR = first host, MASTER_PORT = 29500); a torchrun command reads
exactly these.

On a GPU cluster, switch to:
    partition="gpu", gpus_per_node=8, image="/lustre/images/pytorch.sqsh",
    command="torchrun --nnodes=$WORLD_SIZE --nproc-per-node=$NUM_GPU_PER_NODE --node-rank=$NODE_RANK "
            "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py --out {results_dir}",
(gpus_per_node at the node's maximum takes whole nodes; the image must be a .sqsh, converted beforehand.)

The Slurm connection `slurm_default` gives the login host(s), user, key and results root.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

with DAG(
    dag_id="slurm_train",
    schedule=None,
    catchup=False,
    tags=["npa", "slurm", "example"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
) as dag:
    SlurmSubmitOperator(
        task_id="train",
        slurm_conn_id="slurm_default",
        partition="cpu",
        nodes=2,
        gpus_per_node=0,  # the CPU test cluster; 8 on a GPU partition
        cpus_per_task=1,
        time_hours=0.25,
        command=(
            'echo "rendezvous node=${SLURMD_NODENAME:-$(hostname)} WORLD_SIZE=$WORLD_SIZE '
            "NUM_GPU_PER_NODE=$NUM_GPU_PER_NODE NODE_RANK=$NODE_RANK MASTER_ADDR=$MASTER_ADDR "
            'MASTER_PORT=$MASTER_PORT"\n'
            'for step in 1 2 3; do echo "node $NODE_RANK step $step"; sleep 1; done'
        ),
        poll_interval=5,
        deferrable=True,
    )
