"""Job failures through Airflow itself (``dag.test()``, real metadata DB, retries as configured):
NODE_FAIL under a running job is an infrastructure failure, retried on a new job name with the node
excluded; a program error (exit 3) fails once and uses no retry."""

from __future__ import annotations

import json
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from reliability_harness import airflow_home, jobs_settled, record_figures, run_dag_test, sacct_jobs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_node_fail_is_retried_elsewhere_and_program_error_is_not_retried(
    slurm_cluster, cluster_ssh, cluster_admin, tmp_path
):
    dag_id = f"npa_rel_fail_{uuid.uuid4().hex[:6]}"
    infra_prefix = f"npa-{dag_id.replace('_', '-')}-infra-"
    program_prefix = f"npa-{dag_id.replace('_', '-')}-program-"
    dag_source = textwrap.dedent(
        f"""
        from datetime import timedelta
        import pendulum
        from airflow.sdk import DAG
        from npa_airflow.slurm.operators import SlurmSubmitOperator

        common = dict(partition="cpu", gpus_per_node=0, cpus_per_task=1, time_hours=0.1, poll_interval=2)
        with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False,
                 default_args={{"retries": 2, "retry_delay": timedelta(seconds=0)}}) as dag:
            SlurmSubmitOperator(task_id="infra", command="echo on-$(hostname); sleep 15; echo finished",
                                requeue=False, **common)
            SlurmSubmitOperator(task_id="program", command="echo loading; echo 'fatal: bad config' >&2; exit 3",
                                **common)
        """
    )
    failed: dict[str, str] = {}

    def break_the_node_under_try_1() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not failed:
            for line in cluster_ssh("squeue -h -o '%i %j %T %N'").stdout.splitlines():
                job_id, name, state, node = [*line.split(), "", "", "", ""][:4]
                if name.startswith(infra_prefix) and name.endswith("-t1") and state == "RUNNING" and node:
                    cluster_admin(f"scontrol update nodename={node} state=down reason=npa-reliability-node-fail")
                    failed.update(job_id=job_id, node=node)
                    break
            time.sleep(0.5)
        if failed:  # back as soon as the job is NODE_FAIL: only the exclusion keeps try 2 off it
            try:
                until = time.monotonic() + 60
                while time.monotonic() < until and not any(
                    j["state"] == "NODE_FAIL" for j in sacct_jobs(cluster_ssh, infra_prefix)
                ):
                    time.sleep(0.5)
            finally:
                cluster_admin(f"scontrol update nodename={failed['node']} state=resume", check=False)

    env = airflow_home(tmp_path / "airflow", slurm_default=json.loads(slurm_cluster.conn_uri_json))
    watcher = threading.Thread(target=break_the_node_under_try_1, daemon=True)
    watcher.start()
    try:
        result, output = run_dag_test(env, dag_source, timeout=600)
    finally:
        watcher.join(timeout=120)
        if failed:
            cluster_admin(f"scontrol update nodename={failed['node']} state=resume", check=False)
    assert failed, "try 1 of the infra task never ran"

    infra, program = result["infra"], result["program"]
    assert infra["state"] == "success" and infra["try_number"] == 2, output[-6000:]
    assert "infrastructure reason" in output and "NODE_FAIL" in output
    handle = infra["handle"]
    assert handle["job_name"].endswith("-t2") and handle["retry_of"] == failed["job_id"]
    script = cluster_ssh(f"cat {Path(handle['results_dir']).parent}/sbatch/{handle['job_name']}.sbatch", check=True)
    assert f"#SBATCH --exclude={failed['node']}" in script.stdout
    infra_jobs = {j["name"][-3:]: j for j in jobs_settled(cluster_ssh, infra_prefix, 2)}
    assert infra_jobs["-t1"]["state"] == "NODE_FAIL"
    assert infra_jobs["-t2"]["state"] == "COMPLETED" and infra_jobs["-t2"]["nodes"] != failed["node"]

    assert program["state"] == "failed" and program["try_number"] == 1  # no retry consumed
    assert "a program failure, not retried" in output and "fatal: bad config" in output
    program_jobs = jobs_settled(cluster_ssh, program_prefix, 1)
    # without accounting, slurmctld forgets an ended job MinJobAge after its end (30 s on that bed)
    forgotten = not slurm_cluster.accounting and not program_jobs
    assert forgotten or [j["state"] for j in program_jobs] == ["FAILED"], program_jobs
    record_figures(
        "node_fail", injections=1, tries=2, jobs=len(infra_jobs), excluded_node=failed["node"],
        new_job_name=handle["job_name"], lost=0,
    )  # fmt: skip
    record_figures("program_error_exit_3", injections=1, tries=1, retries_used=0, jobs=len(program_jobs))
