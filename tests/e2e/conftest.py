"""One real Airflow (dev/airflow) per test session, wired to the local Slurm cluster.

It runs in its own AIRFLOW_HOME and port so a demo instance (dev/airflow's defaults) is left alone.
NPA_E2E_KEEP=1 leaves it running after the session (a later session reuses it: faster iteration).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TEST_DEPLOYMENT_ENV
from tests.e2e.airflow_api import AirflowApi, AirflowApiError, poll

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_SCRIPT = REPO / "dev" / "airflow"
E2E_DAGS = Path(__file__).resolve().parent / "dags"
# A stand-in session credential, given to Airflow as the Variable `npa_e2e_token`; the test DAG hands it
# to the job as a secret, and the tests check it never shows in the log, XCom or rendered template.
E2E_SECRET = "npa-e2e-token-5b0d7c1f9a2e"


def _is_e2e(item: pytest.Item | None) -> bool:
    return item is not None and Path(__file__).resolve().parent in Path(item.fspath).resolve().parents


# The session's quick-shape deployment while it runs, and the last e2e test of the session.
_QUICK: list[AirflowInstance] = []
_LAST_E2E: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_e2e(item):
            item.add_marker(pytest.mark.e2e)
    _LAST_E2E[:] = [item.nodeid for item in items if _is_e2e(item)][-1:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """The quick-shape deployment stops after the session's last e2e test, not at its end: its processes would
    otherwise load the 2-core machine while the tiers after it run."""
    yield
    if _QUICK and [item.nodeid] == _LAST_E2E:
        _QUICK.pop().stop()


@dataclass
class AirflowInstance:
    api: AirflowApi
    env: dict[str, str]
    home: Path

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(AIRFLOW_SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        r = self.run(*args, timeout=timeout)
        if r.returncode != 0:
            raise AssertionError(f"dev/airflow {' '.join(args)} exited {r.returncode}:\n{r.stderr}\n{r.stdout}")
        return r

    def wait_for_no_triggers(self, timeout: float = 60) -> None:
        """Quick shape (SQLite) only: wait until the trigger table is empty, then a little more.

        SQLite hands a new trigger the id of the newest deleted one, and Airflow 3.3.2 can then deliver a late
        event of the old trigger to the task that just deferred (it resumes at once and fails). Starting each
        test with no trigger left, and the triggerer past its next loop, keeps tests from inheriting ids.
        """
        database = self.home / "airflow.db"
        if not database.exists():
            return

        def empty() -> bool | None:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10) as conn:
                return conn.execute("SELECT count(*) FROM trigger").fetchone()[0] == 0 or None

        try:
            poll(empty, timeout, "no trigger left from the previous test", interval=0.5)
        except AirflowApiError:
            return  # a task of an earlier test still waits: its trigger keeps its id, nothing to inherit
        time.sleep(3)

    def stop(self) -> None:
        self.api.close()
        if os.environ.get("NPA_E2E_KEEP") != "1":
            self.script("down", timeout=300)

    def kill_triggerer(self) -> None:
        self.script("kill-triggerer")

    def start_triggerer(self) -> None:
        self.script("start-triggerer")


def _deployment(shape: str, home: str, port: str) -> AirflowInstance:
    env = {
        # Its own identity: its scheduler creates it in its metadata database (not the tests' in-process one).
        **{k: v for k, v in os.environ.items() if k != TEST_DEPLOYMENT_ENV},
        "NPA_AIRFLOW_SHAPE": shape,
        "NPA_AIRFLOW_HOME": home,
        "NPA_AIRFLOW_PORT": port,
        "NPA_AIRFLOW_EXTRA_DAGS": str(E2E_DAGS),
        "NPA_AIRFLOW_CLUSTER": "0",  # the slurm_cluster fixture has brought the cluster up already
        "NPA_AIRFLOW_USER": "admin",
        "NPA_AIRFLOW_PASSWORD": "e2e-admin",
        "AIRFLOW_VAR_NPA_E2E_TOKEN": E2E_SECRET,
        # The triggerer imports the e2e DAGs' own operator module by name (start_from_trigger).
        "PYTHONPATH": os.pathsep.join(p for p in (str(E2E_DAGS), os.environ.get("PYTHONPATH", "")) if p),
    }
    keep = os.environ.get("NPA_E2E_KEEP") == "1"
    instance = AirflowInstance(
        api=AirflowApi(f"http://127.0.0.1:{port}", "admin", "e2e-admin"), env=env, home=Path(home)
    )
    reuse = keep and subprocess.run([str(AIRFLOW_SCRIPT), "status"], env=env, capture_output=True).returncode == 0
    if not reuse:
        started = time.monotonic()
        instance.script("up", "--shape", shape, "--fresh", timeout=600)
        print(f"\n[e2e] Airflow ({shape} shape) up in {time.monotonic() - started:.0f}s")
    return instance


@pytest.fixture(scope="session")
def airflow(slurm_cluster) -> Iterator[AirflowInstance]:
    """The quick shape: SQLite, LocalExecutor, one scheduler, one triggerer (stopped after the last e2e test)."""
    instance = _deployment(
        "quick",
        os.environ.get("NPA_E2E_AIRFLOW_HOME", "/var/tmp/npa-airflow-e2e"),
        os.environ.get("NPA_E2E_AIRFLOW_PORT", "28090"),
    )
    _QUICK.append(instance)
    try:
        yield instance
    finally:
        if instance in _QUICK:
            _QUICK.remove(instance)
            instance.stop()


@pytest.fixture(scope="module")
def production(slurm_cluster) -> Iterator[AirflowInstance]:
    """The production shape: PostgreSQL, Redis, Celery (two workers), two schedulers, two triggerers.

    Per module: its ten processes would otherwise load the 2-core machine for the rest of the session."""
    instance = _deployment(
        "production",
        os.environ.get("NPA_E2E_PROD_AIRFLOW_HOME", "/var/tmp/npa-airflow-prod-e2e"),
        os.environ.get("NPA_E2E_PROD_AIRFLOW_PORT", "28190"),
    )
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def api(airflow: AirflowInstance) -> AirflowApi:
    return airflow.api


@pytest.fixture(scope="session")
def e2e_secret() -> str:
    return E2E_SECRET


@pytest.fixture(scope="session")
def sacct_state(slurm_cluster):
    """The Slurm state of a job as sacct reports it, read over real ssh as the cluster user."""

    def state(job_id: str) -> str:
        argv = [
            "ssh", "-F", "/dev/null", "-i", slurm_cluster.key_file, "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={slurm_cluster.known_hosts}", "-p", str(slurm_cluster.port),
            f"{slurm_cluster.user}@{slurm_cluster.host}",
            f"sacct -X -n -P -o State -j {int(job_id.split(';')[0])}",
        ]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
        lines = out.split()
        return lines[0] if lines else ""

    return state


@pytest.fixture(scope="session")
def wait_sacct(sacct_state):
    """Wait until sacct shows the job in a state starting with one of `prefixes`; return that state."""

    def wait(job_id: str, prefixes: tuple[str, ...], timeout: float = 30) -> str:
        return poll(
            lambda: (s := sacct_state(job_id)).startswith(prefixes) and s,
            timeout,
            f"Slurm job {job_id} in {prefixes} (sacct)",
            interval=1,
        )

    return wait


@pytest.fixture(autouse=True)
def _no_inherited_trigger(request: pytest.FixtureRequest) -> None:
    """Tests on the quick shape start with no trigger left by the previous test (see wait_for_no_triggers)."""
    if "airflow" in request.fixturenames:
        request.getfixturevalue("airflow").wait_for_no_triggers()
