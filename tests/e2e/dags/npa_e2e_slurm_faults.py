"""Test DAGs for the production-shape fault tests (tests/e2e/test_production_faults.py).

- `npa_e2e_slurm_worker_kill`: one Slurm job; the task stays on its worker for `params.linger` seconds after
  sbatch returned and before the job handle reaches XCom, the window in which the test SIGKILLs the worker.
  One retry, so the next try must find and adopt the job instead of submitting a second one.
- `npa_e2e_slurm_many`: MANY mapped Slurm jobs of `params.seconds` ticks, waiting at the same time.
"""

from __future__ import annotations

import time

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

MANY = 20
TICKER = {
    "command": 'for i in $(seq 1 {{ params.seconds }}); do echo "tick $i of {{ params.seconds }}"; sleep 1; done',
    "partition": "cpu",
    "gpus_per_node": 0,
    "cpus_per_task": 1,
    "time_hours": 0.25,
}


class LingeringSubmitOperator(SlurmSubmitOperator):
    """SlurmSubmitOperator that waits on its worker between the submission and the handle's XCom push."""

    def _adopt_or_submit(self, context, *args, **kwargs):
        handle = super()._adopt_or_submit(context, *args, **kwargs)
        if context["ti"].try_number == 1:
            linger = float(context["params"]["linger"])
            self.log.info("Submitted job %s; lingering %.0f s before the handle reaches XCom", handle.job_id, linger)
            time.sleep(linger)
        return handle


with DAG(
    dag_id="npa_e2e_slurm_worker_kill",
    schedule=None,
    catchup=False,
    params={"seconds": 30, "linger": 60},
    tags=["npa-e2e"],
):
    LingeringSubmitOperator(task_id="ticker", poll_interval=2, retries=1, retry_delay=0, **TICKER)

with DAG(dag_id="npa_e2e_slurm_many", schedule=None, catchup=False, params={"seconds": 60}, tags=["npa-e2e"]):
    SlurmSubmitOperator.partial(task_id="ticker", poll_interval=5, max_active_tis_per_dagrun=32, **TICKER).expand(
        environment=[{"NPA_E2E_INDEX": str(i)} for i in range(MANY)]
    )
