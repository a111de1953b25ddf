"""The production-shape Airflow the triggerer benchmark runs in (dev/airflow, its own home and ports), and the
few things the benchmark needs from it: the REST API, the metadata database, the measured triggerer's pid.

Brought up with the benchmark DAG folder as the extra bundle, the SSH provider's connection `npa_bench_ssh`
(the same login host and key as `slurm_default`, the host key pinned), and a triggerer capacity above the
largest N. The second triggerer is stopped for the measurements so that one triggerer holds every trigger.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine

from benchmarks.cluster import REPO, ClusterEnv
from tests.e2e.airflow_api import AirflowApi

AIRFLOW_SCRIPT = REPO / "dev" / "airflow"
BENCH_DAGS = REPO / "benchmarks" / "dags"
DAG_ID = "npa_bench_waiting"
ANCHOR_CONN_ID = "npa_bench_ssh"
MEASURED_TRIGGERER = "triggerer-1"
IDLE_TRIGGERER = "triggerer-2"
USER, PASSWORD = "admin", "bench-admin"


def anchor_connection(env: ClusterEnv) -> str:
    """The SSH provider's connection to the same login host as `slurm_default`, host key pinned (JSON)."""
    host_key = pinned_host_key(Path(env.known_hosts).read_text(), env.host, env.port)
    extra = {"key_file": env.key_file, "host_key": host_key}
    conn = {"conn_type": "ssh", "host": env.host, "port": env.port, "login": env.user, "extra": extra}
    return json.dumps(conn)


def pinned_host_key(known_hosts: str, host: str, port: int) -> str:
    """'<type> <base64>' of the known_hosts entry for host:port (`[host]:port`, or `host` on port 22)."""
    name = host if port == 22 else f"[{host}]:{port}"
    for line in known_hosts.splitlines():
        parts = line.split()
        if len(parts) >= 3 and name in parts[0].split(","):
            return f"{parts[1]} {parts[2]}"
    raise RuntimeError(f"no known_hosts entry for {name}; is the cluster up (dev/cluster up)?")


BENCH_DEPLOYMENT_KEY = "npa-benchmark-deployment-0001"


@dataclass
class Deployment:
    env: dict[str, str]
    home: Path
    api: AirflowApi

    @classmethod
    def create(cls, cluster: ClusterEnv, *, capacity: int, poll_interval: int, home: str, port: int) -> Deployment:
        venv = REPO / ".venv"
        env = {
            **os.environ,
            "NPA_VENV": str(venv if venv.exists() else Path(sys.prefix)),
            "NPA_AIRFLOW_SHAPE": "production",
            "NPA_AIRFLOW_HOME": home,
            "NPA_AIRFLOW_PORT": str(port),
            "NPA_AIRFLOW_EXTRA_DAGS": str(BENCH_DAGS),
            "NPA_AIRFLOW_CLUSTER": "0",  # benchmarks/run has brought the cluster up
            "NPA_AIRFLOW_USER": USER,
            "NPA_AIRFLOW_PASSWORD": PASSWORD,
            "NPA_AIRFLOW_TRIGGERER_CAPACITY": str(capacity),
            "NPA_BENCH_POLL_INTERVAL": str(poll_interval),
            f"AIRFLOW_CONN_{ANCHOR_CONN_ID.upper()}": anchor_connection(cluster),
            # A known identity, so that the benchmark can tell the job names its tasks give their jobs.
            "AIRFLOW__NPA_AIRFLOW__DEPLOYMENT_ID": BENCH_DEPLOYMENT_KEY,
        }
        api = AirflowApi(f"http://127.0.0.1:{port}", USER, PASSWORD, timeout=120.0)
        return cls(env=env, home=Path(home), api=api)

    def script(self, *args: str, timeout: float = 900) -> str:
        r = subprocess.run([str(AIRFLOW_SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"dev/airflow {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}\n{r.stdout}")
        return r.stdout

    def up(self, fresh: bool) -> None:
        self.script("up", "--shape", "production", *(["--fresh"] if fresh else []))

    def down(self) -> None:
        self.script("down", timeout=600)

    def only_measured_triggerer(self) -> None:
        self.script("stop", IDLE_TRIGGERER)

    def both_triggerers(self) -> None:
        self.script("start", IDLE_TRIGGERER)

    def pid(self, component: str) -> int:
        """The component's pid, which is also its process group id (dev/airflow starts each with setsid)."""
        return int((self.home / "run" / f"{component}.pid").read_text().strip())

    def metadata_db(self) -> Engine:
        url = next(
            shlex.split(line.split("=", 1)[1])[0]
            for line in self.script("env").splitlines()
            if line.startswith("export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=")
        )
        return create_engine(url, pool_pre_ping=True)

    def task_log_dir(self, run_id: str, task_id: str) -> Path:
        return self.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task_id}"


def sshd_listener_pids(cluster: ClusterEnv, ports: tuple[int, ...]) -> set[int]:
    pids = set()
    for port in ports:
        try:
            pids.add(int(Path(cluster.dir, "run", "pids", f"sshd-{port}.pid").read_text().strip()))
        except (OSError, ValueError):
            continue
    return pids
