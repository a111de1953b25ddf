"""Run the benchmark suite against the local cluster and print its tables.

    .venv/bin/python -m benchmarks                  # everything (hours: the triggerer part at N = 100, 500, 1000)
    .venv/bin/python -m benchmarks --only triggerer --sizes 100,500,1000   # the real-triggerer comparison
    .venv/bin/python -m benchmarks --only imports   # one part: triggerer, monitoring, submit, logs, imports
    .venv/bin/python -m benchmarks --only monitoring --ns 1,50 --quick

Parts: `triggerer` runs N mapped tasks in a real production-shape Airflow (dev/airflow, its own home and port)
against the SSH provider's SSHRemoteJobOperator; `monitoring` is a micro-benchmark of the poller (one asyncio
loop standing in for the triggerer); `submit`, `logs` and `imports` measure the hook and DAG parse cost.
The cluster must be up (`dev/cluster up`). Nothing here is a test: figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import sys
import time

from benchmarks.cluster import ClusterEnv
from benchmarks.report import json_safe
from npa_airflow.exceptions import NpaError

PARTS = ("triggerer", "monitoring", "submit", "logs", "imports")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma list of parts ({', '.join(PARTS)})")
    parser.add_argument("--sizes", default="100,500,1000", help="mapped tasks waiting at once (triggerer)")
    parser.add_argument("--window", type=float, default=120.0, help="steady-state window, seconds (triggerer)")
    parser.add_argument("--steady-after", type=float, default=65.0, help="s after all deferred (triggerer)")
    parser.add_argument("--cancel-wait", type=float, default=60.0, help="how long to wait for cancels (triggerer)")
    parser.add_argument("--anchor-cancel-up-to", type=int, help="largest N of the anchor's cancel run (triggerer)")
    parser.add_argument(
        "--sides",
        default="npa,npa_trigger,anchor",
        help="which sides to run (triggerer): npa, npa_trigger (started in the triggerer), anchor",
    )
    parser.add_argument("--phases", default="wait,cancel", help="which DAG runs per side and N (triggerer)")
    parser.add_argument("--mem-floor-mib", type=int, default=1500, help="stop a side below this MemAvailable")
    parser.add_argument("--airflow-home", default="/var/tmp/npa-airflow-bench", help="triggerer part's AIRFLOW_HOME")
    parser.add_argument("--airflow-port", type=int, default=28290, help="triggerer part's API port")
    parser.add_argument("--reuse-airflow", action="store_true", help="do not wipe the triggerer part's home first")
    parser.add_argument("--keep-airflow", action="store_true", help="leave the triggerer part's Airflow running")
    parser.add_argument("--sample-interval", type=float, default=1.0, help="/proc sampling period, s (triggerer)")
    parser.add_argument("--ns", default="1,50,200,500", help="concurrent jobs to watch (monitoring micro-benchmark)")
    parser.add_argument("--interval", type=float, default=5.0, help="trigger poll interval, seconds")
    parser.add_argument("--baseline-max", type=int, default=200, help="largest N the baseline is run at")
    parser.add_argument("--baseline-cycles", type=int, default=3)
    parser.add_argument("--log-mb", type=int, default=50, help="size of the big log job's output, MB")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the submit timings")
    parser.add_argument("--import-reps", type=int, default=3, help="fresh interpreters per import figure")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, 10 MB log job")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {PARTS}")
    if args.quick:
        args.reps, args.import_reps, args.log_mb = 3, 2, min(args.log_mb, 10)

    needs_cluster = any(p != "imports" for p in parts)
    env = ClusterEnv.load() if needs_cluster else None
    if env is not None:
        os.environ["AIRFLOW_CONN_SLURM_DEFAULT"] = env.conn_json

    print(f"# npa-airflow benchmarks, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average {load}\n"
    )
    raw: dict[str, object] = {}
    for part in parts:
        attempts = 1 if part == "triggerer" else 3  # hours long: a failure is reported, not rerun
        raw[part] = _with_retry(part, lambda part=part: _run_part(part, args, env), attempts)
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(json_safe(raw), fh, indent=1)
    return 0


def _with_retry(part: str, call, attempts: int = 3, pause: float = 20.0):
    """The cluster is shared (other suites restart daemons, drain nodes): retry a part that hit that."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except NpaError as exc:
            if attempt == attempts:
                raise
            print(f"!!! {part} failed ({exc}); cluster busy? retrying in {pause:.0f} s", file=sys.stderr, flush=True)
            time.sleep(pause)
    raise AssertionError("unreachable")


def _run_part(part: str, args: argparse.Namespace, env: ClusterEnv | None) -> object:
    if part == "triggerer":
        from benchmarks import triggerer_main
        from benchmarks.triggerer import Options

        opts = Options(
            sizes=[int(x) for x in args.sizes.split(",") if x.strip()],
            window=args.window,
            cancel_wait=args.cancel_wait,
            mem_floor_mib=args.mem_floor_mib,
            steady_after=args.steady_after,
            anchor_cancel_up_to=args.anchor_cancel_up_to,
            sides=tuple(x.strip() for x in args.sides.split(",") if x.strip()),
            phases=tuple(x.strip() for x in args.phases.split(",") if x.strip()),
        )
        dep = triggerer_main.DeploymentOptions(
            home=args.airflow_home,
            port=args.airflow_port,
            fresh=not args.reuse_airflow,
            keep=args.keep_airflow,
            poll_interval=int(args.interval),
            sample_interval=args.sample_interval,
            progress_path=args.json,
        )
        return triggerer_main.run(env, opts, dep)
    if part == "monitoring":
        from benchmarks import monitoring_tables

        ns = [int(x) for x in args.ns.split(",") if x.strip()]
        return asyncio.run(monitoring_tables.run(env, ns, args.interval, args.baseline_max, args.baseline_cycles))
    if part == "submit":
        from benchmarks import submission

        return asyncio.run(submission.run(env, args.reps))
    if part == "logs":
        from benchmarks import logs

        return asyncio.run(logs.run(env, args.log_mb))
    from benchmarks import imports

    return imports.run(args.import_reps)


if __name__ == "__main__":
    sys.exit(main())
