"""The API server benchmark's DAGs (benchmarks/api_server_bounds.py), against the connection `slurm_blackhole`,
whose login host accepts TCP connections and never answers.

- `npa_bench_listener`: N (NPA_BENCH_LISTENER_TASKS, default 1000) Slurm tasks that never run: the benchmark
  creates a run while the DAG is paused, writes each task's own job handle into its XCom and marks the run failed,
  so the API server's listener cancels 1,000 jobs on a cluster that does not answer.
- `npa_bench_live`: 8 running tasks, each with its own job handle in XCom, so the Compute page has live rows whose
  cluster does not answer.
"""

from __future__ import annotations

import os
import time

from airflow.sdk import DAG

from npa_airflow.common import xcom_keys
from npa_airflow.slurm.operators import SlurmSubmitOperator

CONN_ID = "slurm_blackhole"
TASKS = int(os.environ.get("NPA_BENCH_LISTENER_TASKS", "1000"))


class HandleOnly(SlurmSubmitOperator):
    """Pushes the handle its job would have (job id 4000000 + its number) and sleeps: a live row."""

    def execute(self, context):
        from npa_airflow.slurm.handle import SlurmJobHandle

        name = self.job_name_for_context(context)
        root = "/var/tmp/npa-cluster/shared/results"
        handle = SlurmJobHandle(  # the layout's paths (npa_airflow.slurm.submit.layout), spelled out for older releases
            conn_id=CONN_ID, cluster=None, job_id=str(4_000_000 + int(self.task_id.rsplit("_", 1)[1])),
            job_name=name, login_host="127.0.0.1:22", results_dir=f"{root}/{name}",
            stdout_path=f"{root}/slurm-logs/{name}/main.out", stderr_path=f"{root}/slurm-logs/{name}/main.err",
            try_number=1, submitted_at=time.time(), script_path=f"{root}/sbatch/{name}.sbatch",
        )  # fmt: skip
        context["ti"].xcom_push(key=xcom_keys.SLURM_JOB, value=handle.to_dict())
        time.sleep(900)


def _tasks(dag_prefix: str, count: int, kind=SlurmSubmitOperator) -> None:
    for i in range(count):
        kind(
            task_id=f"{dag_prefix}_{i}",
            slurm_conn_id=CONN_ID,
            command="true",
            partition="cpu",
            gpus_per_node=0,
            cpus_per_task=1,
            time_hours=0.1,
        )


with DAG(dag_id="npa_bench_listener", schedule=None, catchup=False, is_paused_upon_creation=True):
    _tasks("job", TASKS)

with DAG(dag_id="npa_bench_live", schedule=None, catchup=False):
    _tasks("live", 8, HandleOnly)
