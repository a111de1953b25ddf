"""A rendered multi-node sbatch script, submitted with real sbatch to the local cluster over real SSH."""

from __future__ import annotations

import base64
import json
import shlex
import time
import uuid

import pytest

from npa_airflow.slurm import commands
from npa_airflow.slurm.submit.scripts import bash_syntax_check, lint_script, render_sbatch
from npa_airflow.slurm.submit.spec import SbatchSpec

pytestmark = pytest.mark.integration


def _wait_terminal(cluster_ssh, job_id: str, timeout: float = 90) -> commands.SlurmJobInfo:
    deadline = time.monotonic() + timeout
    info = None
    while time.monotonic() < deadline:
        result = cluster_ssh(" ".join(commands.build_sacct_states([job_id])))
        if result.returncode != 0 and "accounting storage is disabled" in result.stderr:  # the bed without it
            info = _from_slurmctld(cluster_ssh, job_id)
        else:
            assert result.returncode == 0, result.stderr
            info = commands.parse_sacct(result.stdout).get(job_id)
        if info and info.state.is_terminal:
            return info
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s (last: {info})")


def _from_slurmctld(cluster_ssh, job_id: str) -> commands.SlurmJobInfo | None:
    """The job's state and exit code as slurmctld keeps them after its end (scontrol show job, MinJobAge)."""
    result = cluster_ssh(shlex.join(commands.build_scontrol_job(job_id)))
    return commands.parse_scontrol_job(result.stdout) if result.returncode == 0 else None


def test_two_node_cpu_job_sees_the_rendezvous(slurm_cluster, cluster_ssh):
    tag = uuid.uuid4().hex[:8]
    results = f"{slurm_cluster.results_root}/render-{tag}"
    spec = SbatchSpec(
        job_name=f"npa-render-{tag}-t1",
        command='echo "rank=$NODE_RANK world=$WORLD_SIZE master=$MASTER_ADDR port=$MASTER_PORT host=$(hostname)"',
        log_dir=f"{slurm_cluster.shared}/logs",
        results_dir=results,
        partition="cpu",
        nodes=2,
        gpus_per_node=0,
        cpus_per_task=1,
        time_hours=0.05,
        max_time_hours=8,
        requeue=False,
        leader_post_commands=("echo leader-post-on-$SLURM_PROCID",),
    )
    script = render_sbatch(spec)
    bash_syntax_check(script)
    assert lint_script(script) == []
    script_path = f"{results}/job.sbatch"
    encoded = base64.b64encode(script.encode()).decode()
    cluster_ssh(
        f"mkdir -p {' '.join(spec.log_dirs)} {results} && echo {encoded} | base64 -d > {script_path}", check=True
    )

    submitted = commands.parse_sbatch_submit(cluster_ssh(f"sbatch --parsable {script_path}", check=True).stdout)
    info = _wait_terminal(cluster_ssh, submitted.job_id)
    stdout_path, _ = spec.log_paths_for(submitted.job_id)
    output = cluster_ssh(f"cat {stdout_path} {spec.stderr_path}", check=True).stdout
    assert info.native_state == "COMPLETED", output

    ranks = sorted(line for line in output.splitlines() if line.startswith("rank="))
    assert [line.split(" host=")[0] for line in ranks] == [
        "rank=0 world=2 master=c1 port=29500",
        "rank=1 world=2 master=c1 port=29500",
    ]
    assert output.count("leader-post-on-") == 1 and "leader-post-on-0" in output
    status = json.loads(cluster_ssh(f"cat {results}/status.json", check=True).stdout)
    assert status["job_id"] == submitted.job_id and status["state"] == "COMPLETE"
    assert cluster_ssh(f"cat {results}/child_exit_code", check=True).stdout == "0\n"


def test_failing_job_leaves_no_success_marker(slurm_cluster, cluster_ssh):
    tag = uuid.uuid4().hex[:8]
    results = f"{slurm_cluster.results_root}/render-{tag}"
    spec = SbatchSpec(
        job_name=f"npa-render-{tag}-t1",
        command="echo failing; exit 3",
        log_dir=f"{slurm_cluster.shared}/logs",
        results_dir=results,
        partition="cpu",
        gpus_per_node=0,
        cpus_per_task=1,
        time_hours=0.05,
        max_time_hours=8,
        requeue=False,
    )
    encoded = base64.b64encode(render_sbatch(spec).encode()).decode()
    script_path = f"{results}/job.sbatch"
    cluster_ssh(
        f"mkdir -p {' '.join(spec.log_dirs)} {results} && echo {encoded} | base64 -d > {script_path}", check=True
    )
    submitted = commands.parse_sbatch_submit(cluster_ssh(f"sbatch --parsable {script_path}", check=True).stdout)
    info = _wait_terminal(cluster_ssh, submitted.job_id)
    assert (info.native_state, info.exit_code) == ("FAILED", 3)
    assert cluster_ssh(f"cat {results}/child_exit_code", check=True).stdout == "3\n"
    assert cluster_ssh(f"test -e {results}/status.json; echo $?").stdout == "1\n"
