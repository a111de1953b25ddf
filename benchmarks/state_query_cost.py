"""What one state query costs slurmctld and slurmdbd, on the Slurm release of the bed it runs against.

    .venv/bin/python -m benchmarks.state_query_cost [--jobs 50] [--reps 10]
    NPA_SLURM_VERSION=24.11 .venv/bin/python -m benchmarks.state_query_cost    # the 24.11 bed (dev/cluster)

It holds N pending jobs (sbatch --hold), then runs each command shape `reps` times back to back over the
hook's one SSH connection, reading sdiag and sacctmgr stats before and after: the RPCs one command costs, by
type, and the microseconds the daemon spent on them (total_time delta / reps). Two rounds, the lower kept
(other clients can only add). Shapes: the poller's sacct over the N ids; squeue over them with the poller's
fields; squeue --only-job-state (where the release has it: the hook's second squeue uses it); and the poller's
whole state query with every job last seen pending (SlurmHook.aquery_jobs: the sacct and the squeue in one
round trip). Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import Counter
from collections.abc import Awaitable, Callable

from benchmarks.cluster import ClusterEnv, parse_rpc_counts
from benchmarks.jobs import CONN_ID, BenchRun
from benchmarks.report import table


def counters(env: ClusterEnv) -> tuple[Counter[str], Counter[str], int, int]:
    """(slurmctld RPC counts, slurmdbd RPC counts, slurmctld total µs, slurmdbd total µs) right now."""
    ctld, dbd = env.admin(["sdiag"]), env.admin(["sacctmgr", "show", "stats"])
    return (
        Counter(parse_rpc_counts(ctld)),
        Counter(parse_rpc_counts(dbd)),
        sum(parse_rpc_counts(ctld, "total_time").values()),
        sum(parse_rpc_counts(dbd, "total_time").values()),
    )


async def measure(env: ClusterEnv, call: Callable[[], Awaitable[object]], reps: int) -> tuple[str, str, int, int]:
    """Per-command RPCs by type (slurmctld, slurmdbd) and µs spent, the lower of two rounds."""
    rounds = []
    for _ in range(2):
        before = await asyncio.to_thread(counters, env)
        for _ in range(reps):
            await call()
        after = await asyncio.to_thread(counters, env)
        rounds.append(
            (
                Counter({k: v // reps for k, v in (after[0] - before[0]).items() if v >= reps}),
                Counter({k: v // reps for k, v in (after[1] - before[1]).items() if v >= reps}),
                (after[2] - before[2]) // reps,
                (after[3] - before[3]) // reps,
            )
        )
    ctld, dbd = rounds[0][0] & rounds[1][0], rounds[0][1] & rounds[1][1]
    return (
        ", ".join(f"{k} {v}" for k, v in sorted(ctld.items())) or "none",
        ", ".join(f"{k} {v}" for k, v in sorted(dbd.items())) or "none",
        min(rounds[0][2], rounds[1][2]),
        min(rounds[0][3], rounds[1][3]),
    )


async def run(jobs: int, reps: int) -> tuple[str, list[tuple]]:
    from npa_airflow.slurm.commands import build_sacct_states, build_squeue_only_states, build_squeue_states
    from npa_airflow.slurm.hook import SlurmHook

    env = ClusterEnv.load()
    os.environ["AIRFLOW_CONN_SLURM_DEFAULT"] = env.conn_json
    hook = SlurmHook(CONN_ID)
    version = (await hook.arun(["sinfo", "--version"])).text.split()[-1]
    bench = BenchRun(hook, env.shared, "rpc")
    held = [j.job_id for j in await bench.submit_fillers(jobs)]
    try:
        has_only = "--only-job-state" in (await hook.arun(["squeue", "--help"], check=False)).text
        shapes: dict[str, Callable[[], Awaitable[object]]] = {
            f"sacct -j <{jobs} ids>": lambda: hook.arun(build_sacct_states(held), check=False),
            f"squeue -j <{jobs} ids> (the poller's fields)": lambda: hook.arun(build_squeue_states(held), check=False),
        }
        if has_only:
            shapes[f"squeue --only-job-state -j <{jobs} ids>"] = lambda: hook.arun(
                build_squeue_only_states(held), check=False
            )
        shapes[f"the poller's state query ({jobs} pending)"] = lambda: hook.aquery_jobs(held, pending=held)
        rows = []
        for name, call in shapes.items():
            await call()  # warm: the hook's once-per-connection checks are not the query's cost
            rows.append((version, name, *(await measure(env, call, reps))))
        return version, rows
    finally:
        await bench.cancel_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_query_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=50, help="held jobs the queries ask about")
    parser.add_argument("--reps", type=int, default=10, help="commands per round (two rounds)")
    args = parser.parse_args(argv)
    version, rows = asyncio.run(run(args.jobs, args.reps))
    headers = ("Slurm", "command", "slurmctld RPCs per command", "slurmdbd RPCs per command",
               "slurmctld µs per command", "slurmdbd µs per command")  # fmt: skip
    print(table(f"One state query's cost to the daemons, Slurm {version}", headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
