"""The API server while a cluster does not answer: 1,000 task instances marked failed (the listener cancels their
jobs) and the Compute page opened meanwhile by 10 clients.

    .venv/bin/python -m benchmarks.api_server_bounds [--tasks 1000] [--viewers 10] [--window 150]

It starts its own dev/airflow (production shape: PostgreSQL, Celery; home /var/tmp/npa-airflow-bounds, port 28390)
with the DAGs of benchmarks/dags_api_server and the connection `slurm_blackhole`, whose login host is a socket here
that accepts TCP connections and never says a word (an SSH server that hangs). Then:
1. `npa_bench_live` runs 8 tasks that each hold a job handle of that cluster (live rows on the Compute page);
2. a run of `npa_bench_listener` (paused: its tasks never run) gets each task's own job handle in its XCom;
3. 10 clients read the Compute page's data in a loop; the run is marked failed (Airflow calls the listener once
   per task instance, 1,000 times); for `--window` seconds the clients keep reading and the API server's threads
   are counted.
Printed: how long the mark-failed request took, the page's answer times, the API server's threads before and at
most during the window. Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil

from benchmarks.cluster import REPO, ClusterEnv
from benchmarks.report import table
from tests.e2e.airflow_api import AirflowApi, poll

HOME = "/var/tmp/npa-airflow-bounds"
PORT = 28390
USER, PASSWORD = "admin", "bench-admin"
DEPLOYMENT_KEY = "npa-benchmark-api-server-0001"
DAGS = REPO / "benchmarks" / "dags_api_server"
LISTENER_DAG, LIVE_DAG = "npa_bench_listener", "npa_bench_live"


class BlackHole:
    """A TCP listener on loopback that accepts connections and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)


def dev_airflow(env: dict[str, str], *args: str, timeout: float = 900) -> str:
    r = subprocess.run([str(REPO / "dev" / "airflow"), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"dev/airflow {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return r.stdout


def handle_for(env: ClusterEnv, dag_id: str, task_id: str, run_id: str, job_id: int) -> dict:
    from npa_airflow.common.deployment import Deployment
    from npa_airflow.common.naming import job_name_for
    from npa_airflow.slurm.submit import layout

    name = job_name_for(dag_id, task_id, run_id, -1, 1, deployment=Deployment(DEPLOYMENT_KEY, None, "benchmark"))
    root = f"{env.shared}/results"
    return {
        "conn_id": "slurm_blackhole", "cluster": None, "job_id": str(job_id), "job_name": name,
        "login_host": "127.0.0.1:22", "results_dir": layout.results_dir(root, name),
        "stdout_path": f"{root}/slurm-logs/{name}/main.out", "stderr_path": f"{root}/slurm-logs/{name}/main.err",
        "try_number": 1, "script_path": layout.script_path(root, name),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_server_bounds", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--viewers", type=int, default=10)
    parser.add_argument("--window", type=float, default=150.0, help="seconds of page reads after the mark failed")
    parser.add_argument("--keep", action="store_true", help="leave the benchmark's Airflow running")
    parser.add_argument(
        "--airflow-pythonpath", help="run Airflow with another checkout's npa_airflow (e.g. an earlier release's)"
    )
    args = parser.parse_args(argv)
    cluster, hole = ClusterEnv.load(), BlackHole()
    extra = {"results_root": f"{cluster.shared}/results", "insecure_skip_host_key_check": True, "connect_timeout": 15}
    conn = json.dumps({"conn_type": "slurm", "host": "127.0.0.1", "port": hole.port, "login": "npa", "extra": extra})
    env = {
        **os.environ, "NPA_AIRFLOW_SHAPE": "production", "NPA_AIRFLOW_HOME": HOME, "NPA_AIRFLOW_PORT": str(PORT),
        "NPA_AIRFLOW_EXTRA_DAGS": str(DAGS), "NPA_AIRFLOW_CLUSTER": "0", "NPA_AIRFLOW_USER": USER,
        "NPA_AIRFLOW_PASSWORD": PASSWORD, "AIRFLOW_CONN_SLURM_BLACKHOLE": conn,
        "AIRFLOW__NPA_AIRFLOW__DEPLOYMENT_ID": DEPLOYMENT_KEY, "NPA_BENCH_LISTENER_TASKS": str(args.tasks),
    }  # fmt: skip
    if args.airflow_pythonpath:
        env["PYTHONPATH"] = args.airflow_pythonpath
    dev_airflow(env, "up", "--shape", "production", "--fresh")
    api = AirflowApi(f"http://127.0.0.1:{PORT}", USER, PASSWORD, timeout=300.0)
    try:
        rows = measure(api, cluster, args)
    finally:
        if not args.keep:
            dev_airflow(env, "down")
    print(table(f"API server with a cluster that does not answer ({args.tasks} tasks marked failed)", *rows))
    return 0


def measure(api: AirflowApi, cluster: ClusterEnv, args: argparse.Namespace) -> tuple[tuple, list]:
    api.wait_for_dag(LIVE_DAG, timeout=300)
    live_run = api.trigger(LIVE_DAG)
    poll(lambda: len(api.get("/npa-compute/jobs")["rows"]) >= 8 or None, 300, "8 live rows on the Compute page")
    api.wait_for_dag(LISTENER_DAG, timeout=600)
    body = {"logical_date": None, "conf": {}}
    run_id = api.request("POST", f"/api/v2/dags/{LISTENER_DAG}/dagRuns", json=body).json()["dag_run_id"]
    started = time.monotonic()
    for i in range(args.tasks):
        task_id = f"job_{i}"
        value = handle_for(cluster, LISTENER_DAG, task_id, run_id, 3_000_000 + i)
        path = f"/api/v2/dags/{LISTENER_DAG}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries"
        api.request("POST", path, json={"key": "slurm_job", "value": value}, expect=(201,))
    print(f"... {args.tasks} handles written in {time.monotonic() - started:.0f} s", flush=True)

    server = psutil.Process(int((Path(HOME) / "run" / "api-server.pid").read_text().strip()))
    threads_before = sum(p.num_threads() for p in [server, *server.children(recursive=True)])
    answers: list[tuple[float, int]] = []
    stop = threading.Event()
    token = api.token()

    def viewer() -> None:
        with httpx.Client(base_url=api.base_url, timeout=120) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    code = client.get("/npa-compute/jobs", headers={"Authorization": f"Bearer {token}"}).status_code
                except httpx.TimeoutException:
                    code = 0  # no answer within the client's 120 s
                answers.append((time.monotonic() - t0, code))
                time.sleep(0.2)

    viewers = [threading.Thread(target=viewer, daemon=True) for _ in range(args.viewers)]
    for v in viewers:
        v.start()
    t0 = time.monotonic()
    api.request("PATCH", f"/api/v2/dags/{LISTENER_DAG}/dagRuns/{run_id}", json={"state": "failed"})
    mark_seconds = time.monotonic() - t0
    most_threads = threads_before
    while time.monotonic() - t0 < args.window:
        most_threads = max(most_threads, sum(p.num_threads() for p in [server, *server.children(recursive=True)]))
        time.sleep(0.5)
    stop.set()
    for v in viewers:
        v.join(150)
    api.request("PATCH", f"/api/v2/dags/{LIVE_DAG}/dagRuns/{live_run}", json={"state": "failed"})
    times = sorted(t for t, _ in answers)
    codes = sorted({c for _, c in answers})
    p95 = times[int(len(times) * 0.95) - 1] if times else float("nan")
    headers = ("mark run failed (s)", "page reads", "status codes (0: none in 120 s)", "read p50 (s)", "read p95 (s)",
               "read max (s)", "API server threads before", "most during")  # fmt: skip
    row = (f"{mark_seconds:.1f}", len(times), ",".join(map(str, codes)), f"{statistics.median(times):.3f}",
           f"{p95:.3f}", f"{times[-1]:.3f}", threads_before, most_threads)  # fmt: skip
    return headers, [row]


if __name__ == "__main__":
    raise SystemExit(main())
