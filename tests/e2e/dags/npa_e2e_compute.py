"""Test DAGs for the Compute page (tests/e2e/test_compute_view.py): two Slurm jobs on the `gpu` partition.

`npa_e2e_compute_running` holds one GPU node (8 GPUs) for `seconds`; `npa_e2e_compute_pending` then asks for
both GPU nodes, 8 GPUs each, and waits (Slurm's reason: Resources) until the first one ends.
"""

from __future__ import annotations

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

TICKER = 'for i in $(seq 1 {{ params.seconds }}); do echo "tick $i of {{ params.seconds }}"; sleep 1; done'

for dag_id, nodes in (("npa_e2e_compute_running", 1), ("npa_e2e_compute_pending", 2)):
    with DAG(dag_id=dag_id, schedule=None, catchup=False, params={"seconds": 600}, tags=["npa-e2e"]):
        SlurmSubmitOperator(
            task_id="train",
            command=TICKER,
            partition="gpu",
            nodes=nodes,
            gpus_per_node=8,
            cpus_per_task=1,
            time_hours=0.25,
            poll_interval=2,
            retries=0,
        )
