"""dev/airflow's production shape: PostgreSQL, Redis, CeleryExecutor, two schedulers, two triggerers, two workers.

It is the production-shape deployment of tests/e2e/conftest.py: its own home and ports, apart from the
quick-shape Airflow and from a demo instance.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.airflow_api import AirflowApi, poll
from tests.e2e.conftest import AirflowInstance

pytestmark = pytest.mark.e2e

COMPONENTS = [
    "postgres", "redis", "api-server", "dag-processor", "scheduler-1", "scheduler-2",
    "triggerer-1", "triggerer-2", "celery-worker-1", "celery-worker-2",
]  # fmt: skip
PORT = int(os.environ.get("NPA_E2E_PROD_AIRFLOW_PORT", "28190"))
HOME = Path(os.environ.get("NPA_E2E_PROD_AIRFLOW_HOME", "/var/tmp/npa-airflow-prod-e2e"))
PASSWORD = "e2e-admin"
LOOPBACK = ("127.", "[::1]")


class Production:
    """The deployment (tests/e2e/conftest.py's AirflowInstance) with status and process helpers."""

    def __init__(self, instance: AirflowInstance) -> None:
        self.run = instance.run
        self.script = instance.script

    def status(self) -> tuple[int, dict[str, tuple[int | None, str]], str]:
        """Exit code, {component: (pid, state)} and the whole output of `dev/airflow status`."""
        r = self.run("status", timeout=60)
        components: dict[str, tuple[int | None, str]] = {}
        for line in r.stdout.splitlines():
            if m := re.fullmatch(r"([a-z0-9-]+): pid (\d+) (\S+)", line):
                components[m[1]] = (int(m[2]), m[3])
            elif m := re.fullmatch(r"([a-z0-9-]+): stopped", line):
                components[m[1]] = (None, "stopped")
        return r.returncode, components, r.stdout + r.stderr

    def pids(self) -> set[int]:
        """Every process of the deployment: its process groups, and the postmaster's children."""
        groups = {int(p.read_text()) for p in (HOME / "run").glob("*.pid")}
        out = subprocess.run(["ps", "-eo", "pid=,ppid=,pgid="], capture_output=True, text=True, check=True).stdout
        rows = [tuple(map(int, line.split())) for line in out.splitlines()]
        postmaster = int((HOME / "run" / "postgres.pid").read_text())
        return {pid for pid, ppid, pgid in rows if pgid in groups or ppid == postmaster}


def proc_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.fixture(scope="module")
def production(production) -> Production:
    """The session's production-shape deployment (tests/e2e/conftest.py), with status and process helpers."""
    return Production(production)


def test_every_component_runs_and_is_healthy(production):
    rc, components, output = production.status()
    assert list(components) == COMPONENTS, output
    assert {state for _, state in components.values()} == {"running"}, output
    assert rc == 0, output
    # A second `up` of a healthy deployment only reports: the same pids afterwards.
    production.script("up", timeout=300)
    assert production.status()[1] == components


def test_nothing_listens_beyond_loopback(production):
    pids = production.pids()
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    ours = []
    for line in out.splitlines():
        local = line.split()[3]
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            ours.append(local)
    assert not [addr for addr in ours if not addr.startswith(LOOPBACK)], out
    # The API, PostgreSQL and Redis on their loopback ports; no log server (worker or trigger) anywhere.
    assert {f"127.0.0.1:{PORT}", f"127.0.0.1:{PORT + 3}", f"127.0.0.1:{PORT + 4}"} <= set(ours), out
    log_ports = {PORT + 1, PORT + 2, 8793, 8794}
    assert not [addr for addr in ours if int(addr.rsplit(":", 1)[1]) in log_ports], out


def test_a_task_runs_on_a_celery_worker(production):
    api = AirflowApi(f"http://127.0.0.1:{PORT}", "admin", PASSWORD)
    try:
        api.wait_for_dag("npa_e2e_bash")
        run_id = api.trigger("npa_e2e_bash")
        ti = api.wait_for_state("npa_e2e_bash", run_id, "count", {"success"}, timeout=180)
        lines = api.log_lines("npa_e2e_bash", run_id, "count", ti["try_number"])
        assert [line for line in lines if line.startswith("npa-line-")] == ["npa-line-1", "npa-line-2", "npa-line-3"]
    finally:
        api.close()

    def worker_logged_success() -> bool:  # Celery logs it after the task's state is already in the database
        worker_logs = "".join((HOME / f"celery-worker-{n}.log").read_text() for n in (1, 2))
        return bool(re.search(r"Task execute_workload\[[0-9a-f-]+\] succeeded", worker_logs))

    poll(worker_logged_success, 60, "a Celery worker's log of the task's success")


def test_pause_and_resume_a_triggerer(production):
    pid = production.status()[1]["triggerer-1"][0]
    assert pid is not None
    production.script("pause", "triggerer-1")
    try:
        assert proc_state(pid) == "T"
        rc, components, output = production.status()
        assert components["triggerer-1"] == (pid, "SIGSTOPped"), output
        assert rc != 0, output
    finally:
        production.script("resume", "triggerer-1")
    assert proc_state(pid) != "T"
    assert production.status()[1]["triggerer-1"] == (pid, "running")
    # Its job beats again (and so the deployment is healthy) within a few heartbeats.
    poll(lambda: production.status()[0] == 0, 60, "a healthy deployment after resuming triggerer-1", interval=2)
