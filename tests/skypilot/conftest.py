"""A real SkyPilot API server on loopback (dev/skypilot) for the tests marked `skypilot`.

The fixture installs SkyPilot into its own virtualenv when missing (about a minute), starts the server
(about 5 s) or reuses a running one, and stops it at the end only if it started it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKY_SCRIPT = REPO / "dev" / "skypilot"
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.skypilot)


def _sky_env() -> dict[str, str]:
    out = subprocess.run([str(SKY_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    values = {}
    for line in out.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        values[name] = value.strip("'")
    return values


@pytest.fixture(scope="session")
def skypilot_server() -> Iterator[str]:
    env = _sky_env()
    running = subprocess.run([str(SKY_SCRIPT), "status"], capture_output=True).returncode == 0
    if not running:
        subprocess.run([str(SKY_SCRIPT), "up"], check=True, timeout=900)
    os.environ["AIRFLOW_CONN_SKYPILOT_DEFAULT"] = env["AIRFLOW_CONN_SKYPILOT_DEFAULT"]
    try:
        yield env["NPA_SKY_ENDPOINT"]
    finally:
        if not running and os.environ.get("NPA_SKY_KEEP") != "1":
            subprocess.run([str(SKY_SCRIPT), "down"], timeout=120)


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> dict[str, str]:
    """A throwaway, migrated Airflow metadata DB for dag.test() runs in subprocesses."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(HERE / "dags"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env


def run_dag_test(env: dict[str, str], dag_file: Path, dag_id: str, timeout: float = 600, **extra_env: str) -> dict:
    """``dag.test()`` of one DAG in a subprocess; returns {"states": {task_id: state}, "log": output}."""
    code = f"""
import json, runpy
ns = runpy.run_path({str(dag_file)!r})
dag = next(v for v in ns.values() if getattr(v, "dag_id", None) == {dag_id!r})
run = dag.test()
states = {{ti.task_id: str(ti.state) for ti in run.get_task_instances()}}
print("NPA-STATES " + json.dumps(states))
"""
    connections = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_CONN_")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, **connections, **extra_env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("NPA-STATES ")]
    assert lines, f"dag.test() of {dag_id} printed no states (rc {result.returncode}):\n{output[-6000:]}"
    return {"states": json.loads(lines[-1].removeprefix("NPA-STATES ")), "log": output}


SLURM_INFRA = "slurm/npa-local"


@pytest.fixture(scope="session")
def skypilot_slurm(skypilot_server, slurm_cluster) -> str:
    """SkyPilot's Slurm infra on the local cluster (test set-up: dev/skypilot slurm), enabled on the server."""
    from npa_airflow.burst import client as sky

    subprocess.run([str(SKY_SCRIPT), "slurm"], check=True, capture_output=True, timeout=600)
    with sky.SkyPilotClient(skypilot_server) as client:
        check = sky.ApiRequest("POST", "/check", body=client.identity.body(clouds=["slurm"], verbose=False))
        enabled = client.call(check, timeout=300)
    assert "Slurm" in json.dumps(enabled), f"SkyPilot did not enable the local Slurm cluster: {enabled}"
    os.environ["SLURM_CONF"] = slurm_cluster.slurm_conf
    return SLURM_INFRA


def slurm_jobs_named(prefix: str) -> list[str]:
    """Live Slurm jobs (any user) whose name starts with ``prefix``."""
    out = subprocess.run(
        ["squeue", "-h", "-a", "-o", "%i %j %T"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [line for line in out.splitlines() if line.split()[1].startswith(prefix)]


def wait_no_slurm_jobs(prefix: str, timeout: float = 120) -> list[str]:
    """Wait until no Slurm job named ``prefix...`` is left (COMPLETING ones take a few seconds to go)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = slurm_jobs_named(prefix)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(2)
