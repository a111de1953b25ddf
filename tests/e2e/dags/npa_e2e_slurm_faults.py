"""Test DAGs for the production-shape fault tests (tests/e2e/test_production_faults.py), each also started in
the triggerer (the same dag id with `_trigger`, `start_from_trigger=True`).

- `npa_e2e_slurm_worker_kill`: one Slurm job; the task stays where it submitted for `params.linger` seconds after
  sbatch returned and before the job handle reaches XCom, the window in which the test SIGKILLs that worker (or
  triggerer). One retry, so the next try (or the triggerer taking over) must find and adopt the job instead of
  submitting a second one.
- `npa_e2e_slurm_many`: MANY mapped Slurm jobs of `params.seconds` ticks, waiting at the same time.
"""

from __future__ import annotations

from airflow.sdk import DAG
from npa_e2e_operators import LingeringSubmitOperator

from npa_airflow.slurm.operators import SlurmSubmitOperator

MANY = 20
TICKER = {
    "command": 'for i in $(seq 1 {{ params.seconds }}); do echo "tick $i of {{ params.seconds }}"; sleep 1; done',
    "partition": "cpu",
    "gpus_per_node": 0,
    "cpus_per_task": 1,
    "time_hours": 0.25,
}

for suffix, start_from_trigger in (("", False), ("_trigger", True)):
    with DAG(
        dag_id=f"npa_e2e_slurm_worker_kill{suffix}",
        schedule=None,
        catchup=False,
        params={"seconds": 30, "linger": 60},
        tags=["npa-e2e"],
    ):
        LingeringSubmitOperator(
            task_id="ticker", poll_interval=2, retries=1, retry_delay=0, start_from_trigger=start_from_trigger, **TICKER
        )

    with DAG(
        dag_id=f"npa_e2e_slurm_many{suffix}", schedule=None, catchup=False, params={"seconds": 60}, tags=["npa-e2e"]
    ):
        SlurmSubmitOperator.partial(
            task_id="ticker",
            poll_interval=5,
            max_active_tis_per_dagrun=32,
            start_from_trigger=start_from_trigger,
            **TICKER,
        ).expand(environment=[{"NPA_E2E_INDEX": str(i)} for i in range(MANY)])
