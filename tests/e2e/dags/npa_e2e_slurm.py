"""Test DAGs for the e2e suite: one Slurm job that prints "tick <i> of <n>" once a second.

`n` comes from the run's conf (`{"seconds": n}`, default 40). The job also receives a session credential
(the Airflow Variable `npa_e2e_token`) through the operator's mode-600 sidecar, and fails if it is missing,
so the tests can check the secret reached the job but never the log, XCom or rendered template.
`npa_e2e_slurm_trigger` is the same task started in the triggerer (`start_from_trigger=True`).
"""

from __future__ import annotations

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

for dag_id, start_from_trigger in (("npa_e2e_slurm", False), ("npa_e2e_slurm_trigger", True)):
    with DAG(dag_id=dag_id, schedule=None, catchup=False, params={"seconds": 40}, tags=["npa-e2e"]):
        SlurmSubmitOperator(
            task_id="ticker",
            command=(
                'test -n "$NPA_E2E_TOKEN" || exit 9; '
                'for i in $(seq 1 {{ params.seconds }}); do echo "tick $i of {{ params.seconds }}"; sleep 1; done'
            ),
            partition="cpu",
            gpus_per_node=0,
            cpus_per_task=1,
            time_hours=0.25,
            secret_env={"NPA_E2E_TOKEN": "var:npa_e2e_token"},
            poll_interval=2,
            start_from_trigger=start_from_trigger,
        )
