"""The phases of one triggerer-benchmark run, each against the real deployment and cluster: start a DAG run and
wait until its N tasks are deferred, hold a steady-state window, release the held jobs and wait for the tasks,
or mark the DAG run failed and wait for the jobs to leave the queue.

Slurm is driven locally as the administrator (`scontrol release`, `squeue`, `scancel` with SLURM_CONF), so the
benchmark itself opens no SSH connection that the figures would have to leave out.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine

from benchmarks.cluster import ClusterEnv, RpcSnapshot, SshdActivity, SshdLog, rpc_delta, rpc_snapshot
from benchmarks.deployment import BENCH_DEPLOYMENT_KEY, DAG_ID, Deployment
from benchmarks.sampler import Sampler
from benchmarks.ti_watch import RunTimes, poll_once
from npa_airflow.common.deployment import Deployment as Identity
from npa_airflow.common.naming import job_name_for

LOGIN_PORTS = (2222, 2223)
LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})


def log(message: str) -> None:
    print(f"... {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def job_names(side: str, run_id: str, tag: str, n: int) -> list[str]:
    """The Slurm job name of each mapped task's job (try 1), in map-index order."""
    if side in ("npa", "npa_trigger"):
        identity = Identity(BENCH_DEPLOYMENT_KEY, None, "benchmark")
        return [job_name_for(DAG_ID, side, run_id, i, 1, deployment=identity) for i in range(n)]
    return [f"bench-{tag}-{i}" for i in range(n)]


def parse_squeue(text: str) -> dict[str, tuple[str, str]]:
    """`squeue -h -o %i|%j|%T` lines -> {job name: (job id, state)} (the newest id wins a repeated name)."""
    jobs: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            jobs[parts[1]] = (parts[0], parts[2])
    return jobs


@dataclass
class Marks:
    """Start marks of a window: sshd log offsets (both login hosts), RPC counters, the time."""

    t: float
    sshd: dict[int, int]
    rpc: RpcSnapshot


@dataclass
class WindowCounts:
    seconds: float
    sshd: SshdActivity
    slurmctld: Counter[str]
    slurmdbd: Counter[str]


@dataclass
class Bench:
    """What every phase needs: the cluster, the deployment, its database, the sampler, the sshd logs."""

    cluster: ClusterEnv
    deployment: Deployment
    db: Engine
    sampler: Sampler
    poll_period: float = 0.5
    probe_cost: tuple[Counter[str], Counter[str]] = field(default_factory=lambda: (Counter(), Counter()))

    def sshd_logs(self) -> dict[int, SshdLog]:
        return {p: SshdLog(f"{self.cluster.dir}/log/sshd-{p}.log") for p in LOGIN_PORTS}

    def calibrate_probe(self) -> None:
        """The RPCs two back-to-back counter reads cost (sdiag, sacctmgr stats): left out of every window."""
        first = rpc_snapshot(self.cluster)
        self.probe_cost = rpc_delta(first, rpc_snapshot(self.cluster))

    def mark(self) -> Marks:
        logs = self.sshd_logs()
        return Marks(t=time.time(), sshd={p: lg.mark() for p, lg in logs.items()}, rpc=rpc_snapshot(self.cluster))

    def since(self, marks: Marks) -> WindowCounts:
        after = rpc_snapshot(self.cluster)
        activity = SshdActivity()
        for port, lg in self.sshd_logs().items():
            part = lg.since(marks.sshd[port])
            activity.connections.update(part.connections)
            activity.sessions.update(part.sessions)
        ctld, dbd = rpc_delta(marks.rpc, after)
        return WindowCounts(time.time() - marks.t, activity, ctld - self.probe_cost[0], dbd - self.probe_cost[1])

    # -- Slurm, locally as the administrator -------------------------------------------------------------

    def queue(self) -> dict[str, tuple[str, str]]:
        return parse_squeue(self.cluster.admin(["squeue", "-h", "-u", self.cluster.user, "-o", "%i|%j|%T"]))

    def job_ids(self, names: Iterable[str]) -> list[str]:
        queue = self.queue()
        return [queue[name][0] for name in names if name in queue]

    def submit_times(self, names: Iterable[str]) -> list[float]:
        """When slurmctld took each job of `names` that is in the queue (its own submit time, epoch seconds)."""
        squeue = ["squeue", "-h", "-u", self.cluster.user, "-o", "%j|%V"]
        out = self.cluster.admin(["env", "SLURM_TIME_FORMAT=%s", *squeue])
        submitted = dict(line.strip().split("|", 1) for line in out.splitlines() if line.count("|") == 1)
        return [float(submitted[name]) for name in names if submitted.get(name, "").isdigit()]

    def release(self, ids: list[str]) -> None:
        for chunk in _chunks(ids, 200):
            self.cluster.admin(["scontrol", "release", ",".join(chunk)])

    def cancel(self, ids: list[str]) -> None:
        for chunk in _chunks(ids, 200):
            self.cluster.admin(["scancel", *chunk])

    def sacct_states(self, ids: list[str]) -> Counter[str]:
        states: Counter[str] = Counter()
        for chunk in _chunks(ids, 200):
            out = self.cluster.admin(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(chunk)])
            for line in out.splitlines():
                if "|" in line:
                    states[line.split("|")[1].split()[0]] += 1
        return states

    # -- Airflow ---------------------------------------------------------------------------------------

    def trigger(self, conf: dict) -> str:
        return self.deployment.api.trigger(DAG_ID, conf=conf)

    def mark_run_failed(self, run_id: str) -> None:
        self.deployment.api.request(
            "PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}", json={"state": "failed"}, expect=(200,)
        )

    def watch(
        self, run_id: str, task_id: str, until: Callable[[RunTimes], str | None], timeout: float
    ) -> tuple[RunTimes, str]:
        """Poll the run's mapped task instances until `until` returns a verdict, or `timeout`."""
        times = RunTimes()
        deadline = time.monotonic() + timeout
        while True:
            poll_once(self.db, times, run_id, task_id, DAG_ID)
            verdict = until(times)
            if verdict is not None:
                return times, verdict
            if time.monotonic() > deadline:
                return times, f"timed out after {timeout:.0f} s"
            time.sleep(self.poll_period)

    def watch_queue(self, ids: list[str], timeout: float) -> tuple[dict[str, float], list[str]]:
        """Poll squeue until none of `ids` is live or `timeout`: {id: first time seen gone}, ids still live."""
        wanted, gone = set(ids), {}
        deadline = time.monotonic() + timeout
        while True:
            live = {job_id for job_id, state in self.queue().values() if state in LIVE_STATES} & wanted
            now = time.time()
            for job_id in wanted - live - gone.keys():
                gone[job_id] = now
            if not live or time.monotonic() > deadline:
                return gone, sorted(live)
            time.sleep(self.poll_period)


def read_stamps(directory: Path, side: str, n: int) -> dict[int, float]:
    """{map index: epoch seconds} of the jobs' end stamps (see the benchmark DAG)."""
    stamps = {}
    for i in range(n):
        try:
            stamps[i] = float((directory / f"{side}-{i}.end").read_text().strip())
        except (OSError, ValueError):
            continue
    return stamps


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
