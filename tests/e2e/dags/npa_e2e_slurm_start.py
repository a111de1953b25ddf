"""Test DAGs for tasks started in the triggerer (`start_from_trigger=True`):
tests/e2e/test_production_start_from_trigger.py.

- `npa_e2e_start_plain`: one job that prints its secret (the log must mask it) and "tick <i> of <n>" once a
  second (`{"seconds": n}`, default 20), then exits with `{"exit_code": c}` (default 0); one retry;
- `npa_e2e_start_mapped`: one job per value an upstream task returns (`{"values": [...]}`), each printing it;
- `npa_e2e_start_xcomarg`: a job whose environment is an upstream task's output (an XComArg the triggerer cannot
  rebuild the operator with: a worker starts it).
"""

from __future__ import annotations

from airflow.sdk import DAG, task

from npa_airflow.slurm.operators import SlurmSubmitOperator

COMMON = {
    "partition": "cpu",
    "gpus_per_node": 0,
    "cpus_per_task": 1,
    "time_hours": 0.25,
    "poll_interval": 2,
    "start_from_trigger": True,
}

with DAG(
    dag_id="npa_e2e_start_plain",
    schedule=None,
    catchup=False,
    params={"seconds": 20, "exit_code": 0},
    tags=["npa-e2e"],
):
    SlurmSubmitOperator(
        task_id="ticker",
        command=(
            'test -n "$NPA_E2E_TOKEN" || exit 9; echo "token: $NPA_E2E_TOKEN"; '
            'for i in $(seq 1 {{ params.seconds }}); do echo "tick $i of {{ params.seconds }}"; sleep 1; done; '
            "exit {{ params.exit_code }}"
        ),
        secret_env={"NPA_E2E_TOKEN": "var:npa_e2e_token"},
        retries=1,
        retry_delay=0,
        **COMMON,
    )

with DAG(dag_id="npa_e2e_start_mapped", schedule=None, catchup=False, params={"values": [1, 2]}, tags=["npa-e2e"]):

    @task
    def values(**context) -> list[str]:
        return [f'echo "value {v}"' for v in context["params"]["values"]]

    SlurmSubmitOperator.partial(task_id="echo", **COMMON).expand(command=values())

with DAG(dag_id="npa_e2e_start_xcomarg", schedule=None, catchup=False, tags=["npa-e2e"]):

    @task
    def environment() -> dict[str, str]:
        return {"NPA_E2E_GREETING": "hello from upstream"}

    SlurmSubmitOperator(task_id="greet", command='echo "$NPA_E2E_GREETING"', environment=environment(), **COMMON)
