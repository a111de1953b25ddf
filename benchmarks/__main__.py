"""Run the benchmark suite against the local cluster and print its tables.

    .venv/bin/python -m benchmarks                  # everything (about 6-9 minutes on 2 cores)
    .venv/bin/python -m benchmarks --only imports   # one part: monitoring, submit, logs, imports
    .venv/bin/python -m benchmarks --ns 1,50 --quick

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
from dataclasses import asdict, is_dataclass

from benchmarks.cluster import ClusterEnv

PARTS = ("monitoring", "submit", "logs", "imports")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma list of parts ({', '.join(PARTS)})")
    parser.add_argument("--ns", default="1,50,200,500", help="concurrent jobs to watch (monitoring)")
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
        if part == "monitoring":
            from benchmarks import monitoring

            ns = [int(x) for x in args.ns.split(",") if x.strip()]
            raw[part] = asyncio.run(monitoring.run(env, ns, args.interval, args.baseline_max, args.baseline_cycles))
        elif part == "submit":
            from benchmarks import submission

            raw[part] = asyncio.run(submission.run(env, args.reps))
        elif part == "logs":
            from benchmarks import logs

            raw[part] = asyncio.run(logs.run(env, args.log_mb))
        elif part == "imports":
            from benchmarks import imports

            raw[part] = imports.run(args.import_reps)
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(_clean(raw), fh, indent=1)
    return 0


def _clean(value: object) -> object:
    """JSON-safe copy: dataclasses as dicts, keys as strings, anything else unknown as its str()."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
