"""What one refresh of the Compute page costs the cluster, with 1 and with 10 pages open at once.

    eval "$(dev/airflow env)"    # a running dev/airflow started with NPA_AIRFLOW_EXTRA_DAGS=tests/e2e/dags
    .venv/bin/python -m benchmarks.compute_view [--rounds 5] [--viewers 1,10]

It starts the two jobs of tests/e2e/dags/npa_e2e_compute.py (one running, one pending), pauses the triggerer
(SIGSTOP, so only the API server talks to the cluster), then per round waits until the page's cache is stale
and has N viewers ask for the page's data at the same moment. Counted per round: the SSH command sessions sshd
logged for the API server's own connections (exact), and slurmctld's and slurmdbd's RPCs (sdiag / sacctmgr
stats: every client, but nothing else should be talking while the triggerer is stopped). Afterwards the
triggerer is resumed and both tasks are marked failed (their jobs cancelled). Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
import time

import httpx
import psutil

from benchmarks.cluster import REPO, ClusterEnv, SshdLog, rpc_delta, rpc_snapshot
from benchmarks.report import table
from tests.e2e.airflow_api import AirflowApi, poll

DAGS = ("npa_e2e_compute_running", "npa_e2e_compute_pending")
TASK_ID = "train"


def dev_airflow(*args: str) -> None:
    subprocess.run([str(REPO / "dev" / "airflow"), *args], check=True, capture_output=True, timeout=120)


def triggerers(home: str) -> list[str]:
    with open(os.path.join(home, "shape")) as fh:
        return ["triggerer"] if fh.read().strip() == "quick" else ["triggerer-1", "triggerer-2"]


def api_server_ssh_ports(home: str, ssh_port: int) -> set[int]:
    """Local ports of the API server's (and its workers') SSH connections to the cluster."""
    with open(os.path.join(home, "run", "api-server.pid")) as fh:
        leader = psutil.Process(int(fh.read().strip()))
    pids = {leader.pid, *(p.pid for p in leader.children(recursive=True))}
    return {
        c.laddr.port
        for c in psutil.net_connections(kind="tcp")
        if c.pid in pids and c.raddr and c.raddr.port == ssh_port
    }


def one_round(api: AirflowApi, viewers: int, env: ClusterEnv, home: str) -> dict[str, int]:
    token = api.token()
    clients = [httpx.Client(base_url=api.base_url, timeout=120) for _ in range(viewers)]
    start = threading.Barrier(viewers)
    statuses: list[int] = []

    def view(client: httpx.Client) -> None:
        start.wait()
        statuses.append(client.get("/npa-compute/jobs", headers={"Authorization": f"Bearer {token}"}).status_code)

    sshd = SshdLog(env.sshd_log)
    mark, before = sshd.mark(), rpc_snapshot(env)
    threads = [threading.Thread(target=view, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    time.sleep(1)  # sshd and the counters catch up
    ctld, dbd = rpc_delta(before, rpc_snapshot(env))
    ports = api_server_ssh_ports(home, env.port)
    connections, sessions = sshd.since(mark).count(ports=ports)
    _, foreign = sshd.since(mark).count(ports=ports, mine=False)
    return {
        "ok": statuses.count(200),
        "connections": connections,
        "sessions": sessions,
        "foreign_sessions": foreign,
        "slurmctld": sum(ctld.values()),
        "slurmdbd_jobs": dbd.get("DBD_GET_JOBS_COND", 0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compute_view", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--viewers", default="1,10")
    parser.add_argument("--ttl", type=float, default=10.0, help="the page cache's lifetime, s ([npa_airflow])")
    args = parser.parse_args(argv)
    env, home = ClusterEnv.load(), os.environ["AIRFLOW_HOME"]
    api = AirflowApi(os.environ["NPA_AIRFLOW_URL"], os.environ["NPA_AIRFLOW_USER"], os.environ["NPA_AIRFLOW_PASSWORD"])
    runs = []
    for dag_id in DAGS:
        api.wait_for_dag(dag_id)
        runs.append((dag_id, api.trigger(dag_id)))
        api.wait_for_state(dag_id, runs[-1][1], TASK_ID, {"deferred"}, timeout=120)
    poll(lambda: len(api.get("/npa-compute/jobs")["rows"]) >= 2, 60, "both jobs on the page")
    for name in triggerers(home):
        dev_airflow("pause", name)
    results = []
    try:
        for viewers in (int(v) for v in args.viewers.split(",")):
            for _ in range(args.rounds):
                time.sleep(args.ttl + 1)  # the cached answer is stale: this round pays for a new one
                results.append((viewers, one_round(api, viewers, env, home)))
    finally:
        for name in triggerers(home):
            dev_airflow("resume", name)
        for dag_id, run_id in runs:
            api.set_state(dag_id, run_id, TASK_ID, "failed")
    rows = [
        (n, r["ok"], r["connections"], r["sessions"], r["slurmctld"], r["slurmdbd_jobs"], r["foreign_sessions"])
        for n, r in results
    ]
    headers = ("open pages", "answered 200", "SSH connections opened", "SSH command sessions (API server)",
               "slurmctld RPCs", "slurmdbd job queries", "other clients' sessions")  # fmt: skip
    workers = os.environ.get("AIRFLOW__API__WORKERS", "1")
    title = f"Compute page: cluster cost of one refresh (2 live jobs, one cluster, {workers} API worker(s))"
    print(table(title, headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
