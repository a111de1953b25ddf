"""Test DAG for tests/e2e/test_slurm_secret_masking.py: a Slurm job that prints its session credentials.

The credentials are Variables whose names Airflow's masker does not consider sensitive (the test sets their
values): one plain, one multi-line, one full of regex metacharacters. The job prints each with text around it,
alone, and through `env`, then exits with `params.exit_code`, so the test reads both a streamed log and a
failure message written after the deferral.
"""

from __future__ import annotations

from airflow.sdk import DAG

from npa_airflow.slurm.operators import SlurmSubmitOperator

with DAG(dag_id="npa_e2e_slurm_secrets", schedule=None, catchup=False, params={"exit_code": 0}, tags=["npa-e2e"]):
    SlurmSubmitOperator(
        task_id="printer",
        command=(
            'echo "key=$HCI_API_KEY!"; echo "$HCI_API_KEY"; printf "%s\\n" "$NPA_MULTI"; echo "x${NPA_REGEX}y"; '
            "env | grep -E '^(HCI_API_KEY|NPA_MULTI|NPA_REGEX)='; echo printed-all; exit {{ params.exit_code }}"
        ),
        partition="cpu",
        gpus_per_node=0,
        cpus_per_task=1,
        time_hours=0.25,
        secret_env={
            "HCI_API_KEY": "var:npa_e2e_plain_value",
            "NPA_MULTI": "var:npa_e2e_multi_value",
            "NPA_REGEX": "var:npa_e2e_regex_value",
        },
        poll_interval=2,
        retries=0,
    )
