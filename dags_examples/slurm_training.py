"""The full Slurm training pipeline: every slow or fragile step runs before the GPU job, as its own task.

    preflight -> convert (.sqsh, CPU partition) -> probe (2-node all-reduce) -> train (multi-node) -> collect
              \\-> stage_code ------------------------------------------------/

- preflight: one read-only SSH round trip (tools, Pyxis/Enroot, writable results root and .sqsh cache, the
  dataset exists, partitions exist and allow the wall time). Nothing is written when it fails.
- convert: the registry image becomes a .sqsh on shared storage once (a CPU Slurm job); later runs reuse it.
  A failed conversion fails here: the GPU job never pulls from a registry.
- probe: a 2-node all-reduce under the image's torchrun (NCCL on GPUs, gloo on CPUs); on a hang it retries
  with the next NCCL knob set and caches the set that works, so later runs skip it.
- train: the multi-node job, in the converted image, with the probe's environment; it waits deferred (no
  worker slot held) and succeeds only with the success marker status.json. The container sees its results dir
  and the dataset (an input) without asking, and the staged code where it is mounted, each at its host path.
- collect: reads the success marker and the metrics the job wrote.

It runs as-is on the local test clusters (`dev/cluster up`, either Slurm version): partition `gpu` (g1, g2: fake
GPUs, so torch uses gloo), `cpu` for the conversion, and test stand-ins for Pyxis/Enroot. On a real cluster, set
the params: image (e.g. nvcr.io/nvidia/pytorch:24.01-py3), dataset (lustre:///...; or once for every run, the
connection's extra dataset_root), gpus_per_node (e.g. 8). The Slurm connection `slurm_default` names the login
host(s), user, key, results root, cpu_partition and sqsh_cache_dir. With no dataset anywhere, the first task
(preflight) fails saying what to set.
"""

from __future__ import annotations

import shlex
from datetime import timedelta

from airflow.sdk import DAG, Param, task

from npa_airflow.slurm.operators import (
    SlurmNcclProbeOperator,
    SlurmPreflightOperator,
    SlurmSqshConvertOperator,
    SlurmSubmitOperator,
)

CONN_ID = "slurm_default"
NODES = 2
GPUS_PER_NODE = 1  # per node; the probe also runs for a single node with 2+ GPUs

# A small data-parallel training run: each rank reads the dataset listing, trains a linear model with DDP
# for a few steps (gloo on CPU, NCCL on GPU) and rank 0 writes metrics.json into the job's results dir.
TRAIN_PY = """\
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = sys.argv[1]
files = sorted(os.listdir(dataset)) if os.path.isdir(dataset) else [dataset]
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 4) + rank
y = x.sum(dim=1, keepdim=True)
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
t = torch.tensor([loss.item()])
dist.all_reduce(t)
if rank == 0:
    out = {"world_size": world, "mean_final_loss": t.item() / world, "dataset_entries": len(files),
           "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
           "image": os.environ.get("NPA_STANDIN_CONTAINER_IMAGE", "")}
    with open(os.path.join(os.environ["NPA_RESULTS_DIR"], "metrics.json"), "w") as f:
        json.dump(out, f)
    print("train: " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def dataset_or_default(dataset: str, conn_id: str = CONN_ID) -> str:
    """The `dataset` param, else the Slurm connection's extra `dataset_root` (read when a task renders, never at
    parse time); with neither, say what to set."""
    if dataset:
        return dataset
    from airflow.sdk import BaseHook

    root = BaseHook.get_connection(conn_id).extra_dejson.get("dataset_root")
    if not root:
        raise ValueError(
            "no training data named: set the DAG param 'dataset' (lustre:///path/on/the/cluster's/shared/storage) "
            f"when triggering, or the extra 'dataset_root' of the Slurm connection {conn_id!r}"
        )
    return str(root)


DATASET = "{{ dataset_or_default(params.dataset) }}"


with DAG(
    dag_id="slurm_training",
    schedule=None,
    catchup=False,
    tags=["npa", "slurm", "example"],
    params={
        "image": Param("registry.local/npa/pytorch:24.01", type="string", description="registry image or .sqsh"),
        "dataset": Param(
            "",
            type="string",
            description="training data on the cluster's shared storage (lustre:///...); empty: the Slurm "
            "connection's extra dataset_root",
        ),
        "partition": Param("gpu", type="string"),
        "convert_mem": Param("7200M", type="string", description="conversion job memory (the seed's profile)"),
    },
    user_defined_filters={"q": shlex.quote},
    user_defined_macros={"dataset_or_default": dataset_or_default},
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
) as dag:
    preflight = SlurmPreflightOperator(
        task_id="preflight",
        slurm_conn_id=CONN_ID,
        dataset_paths=[DATASET],
        partitions=["{{ params.partition }}"],
        time_hours=0.25,
        retries=0,
    )

    convert = SlurmSqshConvertOperator(
        task_id="convert",
        slurm_conn_id=CONN_ID,
        image="{{ params.image }}",
        mem="{{ params.convert_mem }}",
        poll_interval=3,
        retries=0,  # a failed conversion is fixed on the CPU partition, not retried blindly
    )

    probe = SlurmNcclProbeOperator(
        task_id="probe",
        slurm_conn_id=CONN_ID,
        nodes=NODES,
        gpus_per_node=GPUS_PER_NODE,
        partition="{{ params.partition }}",
        image=convert.output,
        poll_interval=3,
    )

    @task
    def stage_code() -> dict:
        """Put the training script on shared storage (never fetched inside the GPU allocation)."""
        from npa_airflow.slurm.hook import SlurmHook, StagedFile

        hook = SlurmHook(CONN_ID)
        root = hook.config.results_root
        code_dir = f"{root}/code/slurm_training"
        path = f"{code_dir}/train.py"
        hook.stage([StagedFile(path, TRAIN_PY.encode(), 0o644)])
        return {"script": path, "mount": code_dir}  # a container sees the code only where it is mounted

    code = stage_code()

    train = SlurmSubmitOperator(
        task_id="train",
        slurm_conn_id=CONN_ID,
        partition="{{ params.partition }}",
        nodes=NODES,
        gpus_per_node=GPUS_PER_NODE,
        cpus_per_task=1,
        time_hours=0.25,
        image=convert.output,
        container_mounts=["{{ ti.xcom_pull(task_ids='stage_code')['mount'] }}"],
        inputs=[DATASET],
        environment=probe.output,  # the probe's working NCCL environment (e.g. {"NCCL_P2P_DISABLE": "1"})
        command=(
            # A port per job: on the loopback test cluster all "nodes" share one host.
            "torchrun --nnodes=$WORLD_SIZE --nproc-per-node=$NUM_GPU_PER_NODE --node-rank=$NODE_RANK "
            "--master-addr=$MASTER_ADDR --master-port=$((20000 + SLURM_JOB_ID % 20000)) "
            "{{ ti.xcom_pull(task_ids='stage_code')['script'] | q }} "
            "{{ dataset_or_default(params.dataset) | replace('lustre://', '') | q }}"
        ),
        success_marker="status.json",
        poll_interval=3,
    )

    @task
    def collect(handle: dict) -> dict:
        """Read the success marker and the metrics from the job's results directory."""
        import json

        from npa_airflow.slurm.hook import SlurmHook

        hook = SlurmHook(CONN_ID)
        results = handle["results_dir"]
        status = json.loads(hook.run(["cat", f"{results}/status.json"]).text)
        metrics = json.loads(hook.run(["cat", f"{results}/metrics.json"]).text)
        if status.get("state") != "COMPLETE":
            raise ValueError(f"job {handle['job_id']} wrote status {status!r}")
        print(f"collect: job {handle['job_id']} {status['state']}; metrics {metrics}")
        return {"job_id": handle["job_id"], "status": status, "metrics": metrics}

    preflight >> [convert, code]
    probe >> train
    code >> train
    collect(train.output)
