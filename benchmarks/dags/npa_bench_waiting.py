"""The triggerer benchmark's DAG: N mapped Slurm jobs waited on by this provider, and/or N by the SSH provider.

`benchmarks/run --only triggerer` triggers it with a conf such as
    {"npa": 100, "npa_trigger": 0, "anchor": 0, "tag": "npa-100-wait", "bench_dir": "/var/tmp/npa-cluster/shared/bench"}
- `npa`: N mapped `SlurmSubmitOperator` tasks, each one held (`--hold`) 1-CPU job on the `cpu` partition;
- `npa_trigger`: the same tasks started in the triggerer (`start_from_trigger=True`: no worker to start them,
  none when their job succeeds);
- `anchor`: N mapped `SSHRemoteJobOperator` tasks (apache-airflow-providers-ssh, deferrable) whose remote
  command submits the same held job with `sbatch --wait` and so waits for it on the login host.
Every job, once released (`scontrol release`), sleeps 1 s and writes its end time (epoch seconds) to
`<bench_dir>/<tag>/<side>-<map index>.end`: the benchmark reads detection latency against that stamp.
A side with 0 tasks is skipped. Both poll every NPA_BENCH_POLL_INTERVAL seconds (default 5, the SSH
operator's default), read when the DAG is parsed.
"""

from __future__ import annotations

import os
import re
import shlex

from airflow.providers.ssh.operators.ssh_remote_job import SSHRemoteJobOperator
from airflow.sdk import DAG, task

from npa_airflow.slurm.operators import SlurmSubmitOperator

POLL_INTERVAL = int(os.environ.get("NPA_BENCH_POLL_INTERVAL", "5"))
PARTITION = "cpu"
TAG_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")
BENCH_DIR_RE = re.compile(r"/[A-Za-z0-9_./-]+")


def _checked(params: dict | None) -> tuple[str, str]:
    if not params:
        raise ValueError("no params: trigger the DAG with a conf (see the module docstring)")
    tag, bench_dir = str(params["tag"]), str(params["bench_dir"])
    if not TAG_RE.fullmatch(tag) or not BENCH_DIR_RE.fullmatch(bench_dir) or ".." in bench_dir:
        raise ValueError(f"tag={tag!r} / bench_dir={bench_dir!r}: expected a short [a-z0-9_-] tag and an absolute path")
    return tag, bench_dir


def _job_body(stamp: str) -> str:
    return f"sleep 1; date +%s.%N > {shlex.quote(stamp)}"


with DAG(
    dag_id="npa_bench_waiting",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["npa-bench"],
    params={"npa": 0, "npa_trigger": 0, "anchor": 0, "tag": "smoke", "bench_dir": "/var/tmp/npa-cluster/shared/bench"},
    default_args={"retries": 0},
) as dag:

    def _npa_commands(side: str, params: dict | None) -> list[str]:
        tag, bench_dir = _checked(params)
        return [_job_body(f"{bench_dir}/{tag}/{side}-{i}.end") for i in range(int(params.get(side, 0)))]  # type: ignore[union-attr]

    @task
    def npa_commands(params: dict | None = None) -> list[str]:  # params: from the task context
        return _npa_commands("npa", params)

    @task
    def npa_trigger_commands(params: dict | None = None) -> list[str]:
        return _npa_commands("npa_trigger", params)

    @task
    def anchor_commands(params: dict | None = None) -> list[str]:
        tag, bench_dir = _checked(params)
        commands = []
        for i in range(int(params["anchor"])):  # type: ignore[index]
            job = f"{bench_dir}/{tag}/anchor-{i}"
            sbatch = [
                "sbatch", "--wait", "--hold", f"--partition={PARTITION}", "--nodes=1", "--ntasks=1",
                "--cpus-per-task=1", "--time=15", f"--job-name=bench-{tag}-{i}", f"--output={job}.out",
                f"--wrap={_job_body(job + '.end')}",
            ]  # fmt: skip
            commands.append(shlex.join(sbatch))
        return commands

    npa_job = {
        "partition": PARTITION,
        "nodes": 1,
        "gpus_per_node": 0,
        "cpus_per_task": 1,
        "time_hours": 0.25,
        "extra_sbatch": ["--hold"],
        "poll_interval": POLL_INTERVAL,
        "deferrable": True,
    }
    SlurmSubmitOperator.partial(task_id="npa", **npa_job).expand(command=npa_commands())
    SlurmSubmitOperator.partial(task_id="npa_trigger", start_from_trigger=True, **npa_job).expand(
        command=npa_trigger_commands()
    )

    SSHRemoteJobOperator.partial(
        task_id="anchor",
        ssh_conn_id="npa_bench_ssh",
        poll_interval=POLL_INTERVAL,
    ).expand(command=anchor_commands())
