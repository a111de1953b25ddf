"""A plain BashOperator DAG: checks the harness itself (trigger, state, logs) without Slurm."""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

with DAG(dag_id="npa_e2e_bash", schedule=None, catchup=False, tags=["npa-e2e"]):
    BashOperator(task_id="count", bash_command="for i in 1 2 3; do echo npa-line-$i; sleep 1; done")
