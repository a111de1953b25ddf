"""Launch one SkyPilot task YAML with ${VAR} placeholders (the seed's `npa burst submit-yaml`).

`burst/task.yaml` keeps its placeholders so no concrete registry, bucket or run id is ever baked in;
`vars` (templated) fills them. A placeholder left unresolved fails the task before any request is sent;
SkyPilot's own `${SKYPILOT_...}` variables stay for run time. The job name defaults to the YAML's name.

Runs as-is on the local stack (`dev/cluster up`, `dev/skypilot up`, `dev/skypilot slurm`); for another
infra, trigger with e.g. {"infra": "k8s", "accelerators": "H100:8", "output_uri": "s3://<bucket>/<prefix>/"}.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from npa_airflow.burst.operators import BurstSubmitYamlOperator

with DAG(
    dag_id="burst_submit_yaml",
    schedule=None,
    catchup=False,
    tags=["npa", "burst", "example"],
    params={
        "infra": Param("slurm/npa-local", type="string"),
        "accelerators": Param("GPU:1", type="string"),
        "output_uri": Param("file:///var/tmp/npa-burst-smoke/", type="string"),
    },
) as dag:
    BurstSubmitYamlOperator(
        task_id="smoke",
        skypilot_conn_id="skypilot_default",
        yaml_path="burst/task.yaml",
        vars={
            "NPA_RUN_ID": "{{ run_id | replace(':', '-') | replace('+', '-') }}",
            "NPA_INFRA": "{{ params.infra }}",
            "NPA_ACCELERATORS": "{{ params.accelerators }}",
            "NPA_OUTPUT_URI": "{{ params.output_uri }}{{ ds_nodash }}/",
        },
        retries=0,
    )
