"""DAGs the `skypilot` tests run with dag.test() against the local SkyPilot API server."""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG

from npa_airflow.burst.operators import BurstSubmitYamlOperator, BurstTorchrunOperator

HERE = Path(__file__).resolve().parent
START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG("npa_burst_yaml_unresolved", schedule=None, start_date=START, catchup=False) as unresolved:
    BurstSubmitYamlOperator(
        task_id="submit",
        yaml_path=str(HERE / "unresolved.yaml"),
        vars={"NPA_RUN_ID": "r1"},
        cluster_name="npa-unresolved-check",
        retries=0,
    )

with DAG("npa_burst_infra_not_enabled", schedule=None, start_date=START, catchup=False) as not_enabled:
    BurstTorchrunOperator(
        task_id="train",
        image="nvcr.io/nvidia/pytorch:25.01-py3",
        nodes=2,
        accelerators="H100:8",
        command="python train.py",
        infra="aws",
        cluster_name="npa-infra-not-enabled",
        poll_interval=1,
        retries=0,
    )
