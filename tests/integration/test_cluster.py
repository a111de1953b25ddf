"""The local Slurm cluster itself (dev/cluster): what every other integration test relies on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CLUSTER_SCRIPT = Path(__file__).resolve().parents[2] / "dev" / "cluster"

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _submit(cluster_ssh, args: str) -> str:
    result = cluster_ssh(f"sbatch --parsable --time=1 {args}", check=True)
    return result.stdout.strip().split(";")[0]


def _wait_state(cluster_ssh, job_id: str, timeout: float = 60, accounting: bool = True) -> str:
    """The job's final state from sacct; from slurmctld (squeue -t all) on the bed without accounting."""
    deadline = time.monotonic() + timeout
    state = ""
    ask = f"sacct -n -X -P -j {job_id} -o State" if accounting else f"squeue -h -t all -o %T --jobs={job_id}"
    while time.monotonic() < deadline:
        state = cluster_ssh(ask, check=True).stdout.strip()
        if state.split(" ")[0] in TERMINAL:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not finished after {timeout} s (last state {state!r})")


@pytest.fixture
def logdir(slurm_cluster, cluster_ssh) -> str:
    path = f"{slurm_cluster.shared}/logs/test-cluster-{uuid.uuid4().hex[:8]}"
    cluster_ssh(f"mkdir -p {path}", check=True)
    return path


@pytest.mark.accounting("sacct and sacctmgr answer for the cluster user")
def test_sacct_answers_for_the_cluster_user(cluster_ssh):
    result = cluster_ssh("sacct -n -X -S now -o JobID; sacctmgr -n -P show assoc user=npa format=Cluster,Account")
    assert result.returncode == 0, result.stderr
    assert "accounting storage is disabled" not in result.stderr
    assert "npa|npa" in result.stdout.splitlines()


def test_login_environment_puts_cluster_tools_first(slurm_cluster, cluster_ssh):
    result = cluster_ssh("echo $SLURM_CONF; echo $PATH; which torchrun python3 srun sbatch", check=True)
    conf, path, *tools = result.stdout.split()
    assert conf == slurm_cluster.slurm_conf
    assert path.split(":")[0] == f"{slurm_cluster.dir}/bin"
    assert len(tools) == 4, result.stdout
    assert all(tool.startswith("/") for tool in tools)


def test_both_login_hosts_answer_with_their_own_host_keys(slurm_cluster, cluster_ssh):
    for port in (slurm_cluster.port, slurm_cluster.port2):
        assert cluster_ssh("squeue -h -o %i >/dev/null && echo ok", port=port, check=True).stdout == "ok\n"
    keys = Path(slurm_cluster.known_hosts).read_text().splitlines()
    assert [line.split()[0] for line in keys] == [
        f"[127.0.0.1]:{slurm_cluster.port}",
        f"[127.0.0.1]:{slurm_cluster.port2}",
    ]
    assert keys[0].split()[2] != keys[1].split()[2]


def test_sshd_logs_each_accepted_connection(slurm_cluster, cluster_ssh):
    log = Path(slurm_cluster.dir) / "log" / f"sshd-{slurm_cluster.port2}.log"
    before = log.read_text().count("Accepted publickey for npa")
    cluster_ssh("true", port=slurm_cluster.port2, check=True)
    deadline = time.monotonic() + 10
    while log.read_text().count("Accepted publickey for npa") <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.read_text().count("Accepted publickey for npa") > before


def test_connection_json_describes_the_cluster(slurm_cluster):
    conn = json.loads(slurm_cluster.conn_uri_json)
    assert (conn["conn_type"], conn["host"], conn["port"], conn["login"]) == (
        "slurm",
        "127.0.0.1",
        slurm_cluster.port,
        "npa",
    )
    assert conn["extra"]["partition"] == "gpu"
    assert conn["extra"]["cpu_partition"] == "cpu"
    assert Path(conn["extra"]["key_file"]).is_file()
    assert conn["extra"]["results_root"] == slurm_cluster.results_root
    assert conn["extra"]["dataset_root"] == f"{slurm_cluster.shared}/data"  # the example pipeline's default data


def test_shared_storage_is_writable_by_the_cluster_user(slurm_cluster, cluster_ssh):
    for sub in ("results", "sqsh", "logs", "data"):
        probe = f"{slurm_cluster.shared}/{sub}/.probe-{uuid.uuid4().hex[:8]}"
        cluster_ssh(f"touch {probe} && rm {probe}", check=True)


def test_two_node_job_runs_one_task_per_node(slurm_cluster, cluster_ssh, logdir):
    job = _submit(
        cluster_ssh,
        f"-p cpu -N2 --ntasks-per-node=1 --wait-all-nodes=1 -o {logdir}/%j.out "
        "--wrap 'srun bash -c \"echo task \\$SLURM_NODEID; scontrol show hostnames | paste -sd,\"'",
    )
    assert _wait_state(cluster_ssh, job, accounting=slurm_cluster.accounting) == "COMPLETED"
    lines = cluster_ssh(f"cat {logdir}/{job}.out", check=True).stdout.splitlines()
    assert sorted(line for line in lines if line.startswith("task ")) == ["task 0", "task 1"]
    assert lines.count("c1,c2") == 2


def test_gpu_job_sees_its_fake_devices(slurm_cluster, cluster_ssh, logdir):
    job = _submit(cluster_ssh, f"-p gpu --gres=gpu:2 -o {logdir}/%j.out --wrap 'echo CVD=$CUDA_VISIBLE_DEVICES'")
    assert _wait_state(cluster_ssh, job, accounting=slurm_cluster.accounting) == "COMPLETED"
    out = cluster_ssh(f"cat {logdir}/{job}.out", check=True).stdout.strip()
    assert re.fullmatch(r"CVD=\d,\d", out), out


def test_gres_beyond_the_node_is_refused(cluster_ssh):
    result = cluster_ssh("sbatch --parsable -p gpu --gres=gpu:9 --wrap true")
    assert result.returncode != 0
    assert "Requested node configuration is not available" in result.stderr


def _node_state(cluster_admin, node: str) -> str:
    line = cluster_admin(f"scontrol show node -o {node}").stdout
    return re.search(r"\bState=(\S+)", line).group(1)


def test_only_the_admin_can_take_a_node_down(cluster_ssh, cluster_admin):
    # g2: the node other tests pin least (the hook's NODE_FAIL test takes c2 down on its own).
    refused = cluster_ssh("scontrol update nodename=g2 state=down reason=npa-test")
    assert refused.returncode != 0
    assert "invalid user id" in refused.stderr.lower()  # Slurm's answer to a non-admin
    try:
        cluster_admin("scontrol update nodename=g2 state=down reason=npa-test")
        assert "DOWN" in _node_state(cluster_admin, "g2")
    finally:
        cluster_admin("scontrol update nodename=g2 state=resume")
    assert "DOWN" not in _node_state(cluster_admin, "g2")


def test_status_lists_every_daemon_up(slurm_cluster):
    result = subprocess.run(
        [str(CLUSTER_SCRIPT), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "NPA_CLUSTER_DIR": slurm_cluster.dir},
    )
    assert result.returncode == 0, result.stdout
    names = [line.split()[0] for line in result.stdout.splitlines() if line.split()[1] == "up"]
    logins = [f"sshd-{slurm_cluster.port}", f"sshd-{slurm_cluster.port2}"]
    if not slurm_cluster.accounting:  # one cluster, no slurmdbd or MariaDB
        assert names == ["munged", "slurmctld", "slurmd-c1", "slurmd-c2", "slurmd-g1", "slurmd-g2", *logins]
        return
    assert names == [
        "munged", "mariadbd", "slurmdbd", "slurmctld", "slurmctld-b",
        "slurmd-c1", "slurmd-c2", "slurmd-g1", "slurmd-g2", "slurmd-b1", "slurmd-b2", *logins,
    ]  # fmt: skip


@pytest.mark.second_cluster("jobs submitted to cluster b from the login hosts")
def test_the_second_cluster_runs_jobs_submitted_from_the_login_hosts(slurm_cluster, cluster_ssh, logdir):
    """`sbatch -M b` from either login host: the job runs on b's nodes and is accounted under b only."""
    b = slurm_cluster.cluster2
    name = f"npa-itest-b-{uuid.uuid4().hex[:6]}"
    for port in (slurm_cluster.port, slurm_cluster.port2):
        out = cluster_ssh(
            f"sbatch --parsable --time=1 -M {b} -J {name} -o {logdir}/%j.out --wrap hostname", port=port, check=True
        ).stdout.strip()
        job_id, cluster = out.split(";")
        assert cluster == b
        deadline = time.monotonic() + 60
        state, nodes = "", ""
        while state not in TERMINAL:
            assert time.monotonic() < deadline, (state, nodes)
            time.sleep(0.5)
            row = cluster_ssh(f"sacct -M {b} -n -X -P -j {job_id} -o State,NodeList").stdout.strip()
            state, _, nodes = row.partition("|")
        assert (state, nodes in ("b1", "b2")) == ("COMPLETED", True), (state, nodes)
    default = cluster_ssh(f"sacct -n -X -P -S now-1hours --name={name} -o JobID", check=True).stdout
    assert default.strip() == ""  # the default cluster's accounting has none of them
