"""A second deployment's DAG file with the same dag_id and task_id as tests/e2e/dags/npa_e2e_slurm.py but another
command (tests/e2e/test_two_deployments.py): staging and prod run "the same DAG" on one cluster account."""

from __future__ import annotations

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

with DAG(dag_id="npa_e2e_slurm", schedule=None, catchup=False, params={"seconds": 20}, tags=["npa-e2e"]):
    SlurmSubmitOperator(
        task_id="ticker",
        command='for i in $(seq 1 {{ params.seconds }}); do echo "staging tick $i"; sleep 1; done',
        partition="cpu",
        gpus_per_node=0,
        cpus_per_task=1,
        time_hours=0.25,
        poll_interval=2,
    )
