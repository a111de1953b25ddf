"""A Burst job's GPU-hours against the real SkyPilot API server and its Slurm infra: what the operator reports
(XCom `npa_usage` and one task-log line) is the job's nodes x accelerators per node x the run time the server's
job queue records (``end_at - start_at``), also for a job that fails."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.burst import client as sky
from npa_airflow.common import xcom_keys
from npa_airflow.common.usage import JobUsage, usage_line
from tests.harness.airflow_tasks import collecting_logger, submit_deferred, task_context
from tests.skypilot.conftest import SLURM_INFRA, wait_no_slurm_jobs

pytestmark = pytest.mark.slow

TASK_YAML = Path(__file__).resolve().parent / "dags" / "usage.yaml"


def queue_record(endpoint: str, cluster: str, job_id: int) -> dict:
    with sky.SkyPilotClient(endpoint) as client:
        record = sky.parse_queue_record(client.call(sky.build_queue(client.identity, cluster)), job_id)
    assert record is not None, f"job {job_id} is not in the queue of {cluster}"
    return record


async def test_a_failed_two_node_job_reports_the_gpu_hours_the_server_recorded(
    skypilot_server, skypilot_slurm, monkeypatch
):
    from npa_airflow.burst.base import BurstLaunchOperatorBase
    from npa_airflow.burst.operators import BurstSubmitYamlOperator

    logger, collected = collecting_logger("burst-usage")
    monkeypatch.setattr(BurstLaunchOperatorBase, "log", property(lambda self: logger))
    variables = {"NPA_INFRA": SLURM_INFRA, "NPA_TICKS": 8, "NPA_EXIT": 3}
    op = BurstSubmitYamlOperator(
        task_id="train", yaml_path=str(TASK_YAML), vars=variables, poll_interval=2, max_wait=900
    )
    ctx = task_context(f"npa_burst_usage_{uuid.uuid4().hex[:6]}", 1, "manual__usage")
    trigger = submit_deferred(op, ctx)
    event = (await asyncio.wait_for(trigger.run().__anext__(), 900)).payload
    handle = event["handle"]
    # The trigger's event comes before the teardown: the server still has the cluster and its job queue.
    record = await asyncio.to_thread(queue_record, skypilot_server, handle["cluster"], handle["job_id"])

    with pytest.raises(AirflowFailException, match="a program failure"):
        op.execute_complete(ctx, event)

    task = yaml.safe_load(TASK_YAML.read_text())
    nodes, per_node = task["num_nodes"], int(task["resources"]["accelerators"].split(":")[1])
    elapsed = record["end_at"] - record["start_at"]
    usage = ctx["ti"].pushed[xcom_keys.USAGE]
    assert (usage["nodes"], usage["gpus"]) == (nodes, nodes * per_node), usage
    assert elapsed >= variables["NPA_TICKS"], record  # the job ran its ticks before it failed
    assert abs(usage["elapsed_seconds"] - elapsed) <= 1, (usage, record)
    assert abs(usage["gpu_hours"] - nodes * per_node * elapsed / 3600) <= nodes * per_node / 3600, (usage, record)
    line = usage_line(JobUsage(usage["gpus"], usage["nodes"], usage["elapsed_seconds"]), "")
    assert line in collected.lines
    print(f"server record: {record}\nXCom {xcom_keys.USAGE}: {usage}\n{line}")
    assert wait_no_slurm_jobs(handle["cluster"]) == []
