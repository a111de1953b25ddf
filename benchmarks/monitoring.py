"""Micro-benchmark of the poller: N SlurmJobTriggers in one process vs a connection-per-trigger baseline.

Not a triggerer: benchmarks/triggerer.py measures the real `airflow triggerer` against the SSH provider.

Ours: N real `SlurmJobTrigger.run()` generators on one asyncio loop (standing in for the triggerer's loop; no
Airflow triggerer process), all sharing the process-wide poller and the hook's pooled connection. Of the N jobs,
up to 8 finish (sleep, then print the epoch time as their last line); the rest are held and stay PENDING, so
every poll still covers all N.

Baseline: the SSH provider's shape applied to Slurm. One asyncssh connection per waiting task, each polling its
own job every interval: `squeue -h -j ID -o %T`, and `sacct -j ID` once squeue no longer lists it. Measured
over the same jobs, for a fixed number of cycles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from benchmarks.cluster import ClusterEnv, SshdLog, local_port, rpc_delta, rpc_snapshot
from benchmarks.counting import Call, CountingHook
from benchmarks.jobs import CONN_ID, BenchJob, BenchRun
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.transport import ssh
from npa_airflow.slurm.triggers import SlurmJobTrigger
from npa_airflow.slurm.watch.poller import get_poller, reset_pollers

MAX_FINISHERS = 8


@dataclass
class Window:
    """What one measured window cost the cluster and this process."""

    cycles: int
    seconds: float
    cpu_seconds: float
    connections_held: int
    connections_opened: int
    ssh_sessions: int
    foreign_sessions: int
    slurmctld: Counter[str] = field(default_factory=Counter)
    slurmdbd: Counter[str] = field(default_factory=Counter)
    own_commands: Counter[str] = field(default_factory=Counter)  # state-query shapes this client sent
    own_ctld: Counter[str] = field(default_factory=Counter)  # attributed with the calibrated per-command cost
    own_dbd: Counter[str] = field(default_factory=Counter)

    def attribute(self, costs: dict[str, tuple[Counter, Counter]]) -> None:
        self.own_ctld, self.own_dbd = attribute(costs, self.own_commands)

    def per_cycle(self, value: float) -> float | None:
        return value / self.cycles if self.cycles else None

    @property
    def ctld_total(self) -> int:
        return sum(self.slurmctld.values())

    @property
    def dbd_jobs(self) -> int:
        return self.slurmdbd.get("DBD_GET_JOBS_COND", 0)


@dataclass
class OursResult:
    n: int
    window: Window
    max_commands_per_cycle: int
    max_state_commands_per_cycle: int
    max_ids_per_query: int
    kinds: Counter[str]
    latencies: list[float]
    disturbed: int
    interval: float
    submit_seconds: float


@dataclass
class BaselineResult:
    n: int
    window: Window
    connect_seconds: float


class Meter:
    """Marks the start of a window and measures it at the end."""

    def __init__(self, env: ClusterEnv) -> None:
        self.env = env
        self.sshd = SshdLog(env.sshd_log)

    def start(self) -> None:
        self.mark = self.sshd.mark()
        self.rpc = rpc_snapshot(self.env)
        self.cpu = time.process_time()
        self.wall = time.monotonic()

    def stop(self, *, cycles: int, my_ports: set[int], held: int, opened: int) -> Window:
        cpu = time.process_time() - self.cpu
        wall = time.monotonic() - self.wall
        activity = self.sshd.since(self.mark)
        ctld, dbd = rpc_delta(self.rpc, rpc_snapshot(self.env))
        _, mine = activity.count(ports=my_ports)
        _, foreign = activity.count(ports=my_ports, mine=False)
        return Window(
            cycles=cycles,
            seconds=wall,
            cpu_seconds=cpu,
            connections_held=held,
            connections_opened=opened,
            ssh_sessions=mine,
            foreign_sessions=foreign,
            slurmctld=ctld,
            slurmdbd=dbd,
        )


def _pool_ports() -> set[int]:
    return {local_port(conn) for conn, _ in ssh.loop_pool().connections.values() if not conn.is_closed()}


CALIBRATION_REPS = 5


async def calibrate(env: ClusterEnv, hook: SlurmHook, job_ids: Sequence[str]) -> dict[str, tuple[Counter, Counter]]:
    """RPCs one command of each shape costs (slurmctld, slurmdbd), so a window's own share can be attributed.

    Each shape runs CALIBRATION_REPS times back to back; the per-call cost of an RPC type is the floor of its
    delta / reps, the lower of two rounds (other clients can only add RPCs, never remove them).
    """
    from npa_airflow.slurm.commands import build_sacct_states, build_squeue_states

    one = job_ids[0]
    shapes = {
        "sacct": build_sacct_states(job_ids),
        "squeue": build_squeue_states(job_ids),
        "squeue -j ID": ["squeue", "-h", "-j", one, "-o", "%T"],
        "sacct -j ID": ["sacct", "-X", "-n", "-P", "-j", one, "-o", "State"],
    }
    costs: dict[str, tuple[Counter, Counter]] = {}
    for name, argv in shapes.items():
        rounds = []
        for _ in range(2):
            before = rpc_snapshot(env)
            for _ in range(CALIBRATION_REPS):
                await SlurmHook.arun(hook, argv, check=False)
            ctld, dbd = rpc_delta(before, rpc_snapshot(env))
            rounds.append(
                (
                    Counter({k: v // CALIBRATION_REPS for k, v in ctld.items() if v >= CALIBRATION_REPS}),
                    Counter({k: v // CALIBRATION_REPS for k, v in dbd.items() if v >= CALIBRATION_REPS}),
                )
            )
        costs[name] = (rounds[0][0] & rounds[1][0], rounds[0][1] & rounds[1][1])
    return costs


def attribute(costs: dict[str, tuple[Counter, Counter]], commands: Counter[str]) -> tuple[Counter, Counter]:
    ctld: Counter[str] = Counter()
    dbd: Counter[str] = Counter()
    for shape, count in commands.items():
        if shape in costs:
            for k, v in costs[shape][0].items():
                ctld[k] += v * count
            for k, v in costs[shape][1].items():
                dbd[k] += v * count
    return ctld, dbd


def quiet_logs() -> None:
    """Triggers log every job's state and output lines; keep the tables readable (warnings still show)."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    for name in ("airflow", "npa_airflow", "asyncssh"):
        logging.getLogger(name).setLevel(logging.WARNING)


def finisher_sleeps(n: int) -> list[float]:
    return [10 + 2.5 * i for i in range(min(n, MAX_FINISHERS))]


async def run_ours(
    env: ClusterEnv, run: BenchRun, hook: CountingHook, jobs: Sequence[BenchJob], interval: float, submit_seconds: float
) -> OursResult:
    poller = get_poller(CONN_ID, lambda _: hook)
    hook.cycle = lambda: poller.stats.cycles
    meter = Meter(env)
    connects0 = ssh.loop_pool().connects
    cycles0 = poller.stats.cycles
    calls0 = len(hook.calls)
    fired: dict[str, float] = {}

    async def wait(trigger: SlurmJobTrigger) -> None:
        async for _event in trigger.run():
            fired[trigger.job_id] = time.time()

    meter.start()
    tasks = [
        asyncio.create_task(wait(SlurmJobTrigger(j.handle(run.tag, run.results_dir), CONN_ID, poll_interval=interval)))
        for j in jobs
    ]
    finishers = [j for j in jobs if j.finishes]
    deadline = time.monotonic() + max(finisher_sleeps(len(jobs))) + 120
    while any(j.job_id not in fired for j in finishers) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    window = meter.stop(
        cycles=poller.stats.cycles - cycles0,
        my_ports=_pool_ports(),
        held=len(_pool_ports()),
        opened=ssh.loop_pool().connects - connects0,
    )
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    calls = hook.calls[calls0:]
    window.own_commands = Counter(c.kind for c in calls if c.kind in ("sacct", "squeue"))
    by_cycle: dict[int, list[Call]] = {}
    for call in calls:
        by_cycle.setdefault(call.cycle, []).append(call)
    state_kinds = {"sacct", "squeue"}
    latencies, disturbed = [], 0
    for job in finishers:
        end = _end_time(job.stdout_path)
        if job.job_id in fired and end is not None:
            latencies.append(fired[job.job_id] - end)
        else:
            disturbed += 1  # never ran to its last line (another client took its node down, say)
    return OursResult(
        n=len(jobs),
        window=window,
        max_commands_per_cycle=max((len(c) for c in by_cycle.values()), default=0),
        max_state_commands_per_cycle=max(
            (sum(1 for x in c if x.kind in state_kinds) for c in by_cycle.values()), default=0
        ),
        max_ids_per_query=max((c.job_ids for c in calls if c.kind == "sacct"), default=0),
        kinds=Counter(c.kind for c in calls),
        latencies=latencies,
        disturbed=disturbed,
        interval=interval,
        submit_seconds=submit_seconds,
    )


def _end_time(stdout_path: str) -> float | None:
    """The job's last stdout line: the epoch time its work ended (shared storage is local here)."""
    try:
        lines = Path(stdout_path).read_text().strip().splitlines()
        return float(lines[-1])
    except (OSError, ValueError, IndexError):
        return None


async def run_baseline(env: ClusterEnv, jobs: Sequence[BenchJob], interval: float, cycles: int) -> BaselineResult:
    """One SSH connection per waiting task, one per-job poll per task per cycle."""
    options = dict(
        username=env.user,
        client_keys=[asyncssh.read_private_key(env.key_file)],
        known_hosts=env.known_hosts,
        agent_path=None,
        config=None,
    )
    opening = asyncio.Semaphore(10)

    async def connect() -> asyncssh.SSHClientConnection:
        async with opening:
            return await asyncssh.connect(env.host, env.port, **options)

    started = time.monotonic()
    conns = await asyncio.gather(*(connect() for _ in jobs))
    connect_seconds = time.monotonic() - started
    meter = Meter(env)
    sent: Counter[str] = Counter()
    try:
        meter.start()

        async def poll(conn: asyncssh.SSHClientConnection, job_id: str) -> None:
            for cycle in range(cycles):
                sent["squeue -j ID"] += 1
                out = await conn.run(f"squeue -h -j {job_id} -o %T", check=False)
                if not str(out.stdout or "").strip():
                    sent["sacct -j ID"] += 1
                    await conn.run(f"sacct -X -n -P -j {job_id} -o State", check=False)
                if cycle < cycles - 1:
                    await asyncio.sleep(interval)

        await asyncio.gather(*(poll(c, j.job_id) for c, j in zip(conns, jobs, strict=True)))
        window = meter.stop(cycles=cycles, my_ports={local_port(c) for c in conns}, held=len(conns), opened=len(conns))
        window.own_commands = sent
    finally:
        for conn in conns:
            conn.close()
    return BaselineResult(n=len(jobs), window=window, connect_seconds=connect_seconds)


async def measure(env: ClusterEnv, n: int, *, interval: float, baseline_max: int, baseline_cycles: int):
    """Submit N jobs, watch them with N triggers, then (N <= baseline_max) poll them the baseline way."""
    quiet_logs()
    reset_pollers()  # a fresh poller on this loop, driven by this N's counting hook
    hook = CountingHook(CONN_ID)
    run = BenchRun(hook, env.shared, f"mon{n}")
    await run.prepare()
    try:
        started = time.monotonic()
        sleeps = finisher_sleeps(n)
        fillers = await run.submit_fillers(n - len(sleeps))
        finishers = await run.submit_finishers(sleeps)
        submit_seconds = time.monotonic() - started
        jobs = [*finishers, *fillers]
        ours = await run_ours(env, run, hook, jobs, interval, submit_seconds)
        await asyncio.sleep(6)  # let the poller see no registrations and go idle before the baseline window
        base = None
        if n <= baseline_max:
            base = await run_baseline(env, jobs, interval, baseline_cycles)
        costs = await calibrate(env, hook, [j.job_id for j in jobs])
        ours.window.attribute(costs)
        if base is not None:
            base.window.attribute(costs)
        return ours, base, costs
    finally:
        await run.cancel_all()
        await run.remove_files()
