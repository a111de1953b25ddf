"""Fixtures for the local Slurm cluster (dev/cluster): a real cluster on loopback, driven over real SSH.

The bed is the one `dev/cluster` selects: NPA_SLURM_VERSION=24.11 runs the tests against the Slurm 24.11 bed
(NPA_CLUSTER_DIR, if set, must hold that bed), NPA_SLURM_ACCOUNTING=none against the site without accounting,
otherwise the 22.05 one. On the site without accounting, tests marked `accounting` or `second_cluster` skip with
their reason; tests marked `no_accounting` run only there.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests check behaviour, never speed: no per-example deadline (Hypothesis' default of 200 ms failed a pure
# parser's test now and then on the loaded 2-core machine).
settings.register_profile("npa", deadline=None)
settings.load_profile("npa")

# The deployment identity of every operator and trigger the tests drive in-process (and of `airflow dags test`
# runs they start): what the scheduler of a real deployment creates in its metadata database
# (npa_airflow.common.deployment). The e2e deployments do not inherit it: each creates its own.
TEST_DEPLOYMENT_ENV = "AIRFLOW_CONN_NPA_AIRFLOW_DEPLOYMENT"
os.environ.setdefault(
    TEST_DEPLOYMENT_ENV,
    json.dumps(
        {"conn_type": "generic", "password": "npa-test-deployment-key-0001", "extra": {"created_at": time.time()}}
    ),
)

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "dev" / "cluster"
CLUSTER_MARKERS = ("integration", "e2e")


@dataclass(frozen=True)
class ClusterInfo:
    dir: str
    host: str
    port: int
    port2: int
    user: str
    key_file: str
    known_hosts: str
    shared: str
    results_root: str
    sqsh_dir: str
    conn_uri_json: str
    slurm_conf: str
    cluster2: str  # the second cluster (`sbatch -M <cluster2>`), same slurmdbd
    slurm_conf2: str  # its slurm.conf, for admin commands on it
    other_user: str  # a second Unix user of the cluster (no login): jobs of "someone else"
    slurm_version: str  # the bed's Slurm release: "22.05" (this machine's packages) or "24.11" (a root filesystem)
    root: str  # the bed's root filesystem ("" when its Slurm is this machine's): admin commands run inside it
    accounting: bool = True  # False: the site without accounting (no slurmdbd; sacct says it is disabled)
    min_job_age: int = 300  # seconds slurmctld keeps an ended job (squeue -t all shows it meanwhile)

    def admin_argv(self, argv: list[str]) -> list[str]:
        """``argv`` as root where the bed's Slurm lives (``dev/cluster exec``; the command itself for 22.05)."""
        return [str(CLUSTER_SCRIPT), "exec", "--", *argv] if self.root else argv


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster-down",
        action="store_true",
        default=False,
        help="stop the local Slurm cluster (dev/cluster down) at the end of the session",
    )


def _cluster_env() -> dict[str, str]:
    out = subprocess.run([str(CLUSTER_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    values = {}
    for line in out.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        values[name] = (shlex.split(value) or [""])[0]
    return values


def _run(argv: list[str], check: bool, timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{argv[-1]!r} exited {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        )
    return result


def _bring_up() -> None:
    result = subprocess.run([str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"dev/cluster up failed (rc {result.returncode}):\n{result.stderr}", pytrace=False)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterInfo]:
    """The running local cluster (brought up, or reused when already up); never torn down unless asked."""
    _bring_up()
    env = _cluster_env()
    os.environ["AIRFLOW_CONN_SLURM_DEFAULT"] = env["AIRFLOW_CONN_SLURM_DEFAULT"]
    cluster_dir = env["NPA_CLUSTER_DIR"]
    yield ClusterInfo(
        dir=cluster_dir,
        host="127.0.0.1",
        port=int(env["NPA_SSH_PORT"]),
        port2=int(env["NPA_SSH_PORT2"]),
        user=env["NPA_SSH_USER"],
        key_file=env["NPA_SSH_KEY"],
        known_hosts=env["NPA_KNOWN_HOSTS"],
        shared=f"{cluster_dir}/shared",
        results_root=f"{cluster_dir}/shared/results",
        sqsh_dir=f"{cluster_dir}/shared/sqsh",
        conn_uri_json=env["AIRFLOW_CONN_SLURM_DEFAULT"],
        slurm_conf=env["NPA_SLURM_CONF"],
        cluster2=env["NPA_SLURM_CLUSTER2"],
        slurm_conf2=env["NPA_SLURM_CONF2"],
        other_user=env["NPA_OTHER_USER"],
        slurm_version=env["NPA_SLURM_VERSION"],
        root=env["NPA_CLUSTER_ROOT"],
        accounting=env.get("NPA_SLURM_ACCOUNTING", "slurmdbd") != "none",
        min_job_age=int(env.get("NPA_SLURM_MIN_JOB_AGE") or 300),
    )
    if request.config.getoption("--cluster-down"):
        subprocess.run([str(CLUSTER_SCRIPT), "down"], check=True, timeout=300)


@pytest.fixture(autouse=True)
def _cluster_for_marked_tests(request: pytest.FixtureRequest) -> None:
    """Tests marked integration or e2e get the cluster (and AIRFLOW_CONN_SLURM_DEFAULT) without asking; those that
    need what the bed lacks (accounting, the second cluster) or another bed's shape skip, naming why."""
    if any(request.node.get_closest_marker(name) for name in CLUSTER_MARKERS):
        cluster: ClusterInfo = request.getfixturevalue("slurm_cluster")
        _skip_unless_the_bed_fits(request.node, cluster)


def _skip_unless_the_bed_fits(node: pytest.Item, cluster: ClusterInfo) -> None:
    """`accounting(why)` and `second_cluster(why)` tests skip on the site without accounting; `no_accounting` tests
    run only there."""
    if cluster.accounting:
        if node.get_closest_marker("no_accounting"):
            pytest.skip(
                "tests a site without accounting: runs on that bed only (NPA_SLURM_ACCOUNTING=none, "
                "dev/cluster --no-accounting)"
            )
        return
    for name, what in (("accounting", "accounting (sacct, slurmdbd)"), ("second_cluster", "the second cluster b")):
        marker = node.get_closest_marker(name)
        if marker is not None:
            why = marker.args[0] if marker.args else ""
            pytest.skip(f"needs {what}, which the bed without accounting does not have" + (f": {why}" if why else ""))


@pytest.fixture
def cluster_ssh(slurm_cluster: ClusterInfo) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a shell command as the cluster user through the real ssh CLI (host key checked).

    Returns the CompletedProcess (text); pass check=True to fail on a non-zero exit.
    """

    def run(cmd: str, *, port: int | None = None, check: bool = False, timeout: float = 120):
        argv = [
            "ssh", "-F", "/dev/null", "-i", slurm_cluster.key_file, "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={slurm_cluster.known_hosts}", "-o", "ConnectTimeout=10",
            "-p", str(port or slurm_cluster.port), f"{slurm_cluster.user}@{slurm_cluster.host}", cmd,
        ]  # fmt: skip
        return _run(argv, check, timeout)

    return run


@pytest.fixture
def cluster_admin(slurm_cluster: ClusterInfo) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a shell command locally as the Slurm administrator (root) with the cluster's SLURM_CONF.

    For what the cluster user may not do, such as `scontrol update nodename=c2 state=down`; pass
    `slurm_conf=slurm_cluster.slurm_conf2` to administer the second cluster.
    Fails (AssertionError with stdout/stderr) on a non-zero exit unless check=False.
    """

    def run(cmd: str, *, check: bool = True, timeout: float = 120, slurm_conf: str | None = None):
        env = {**os.environ, "SLURM_CONF": slurm_conf or slurm_cluster.slurm_conf, "NPA_CLUSTER_DIR": slurm_cluster.dir}
        return _run(slurm_cluster.admin_argv(["bash", "-c", cmd]), check, timeout, env=env)

    return run
