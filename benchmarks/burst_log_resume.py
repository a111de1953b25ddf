"""Burst job log: what resuming costs, by the length of the log.

SkyPilot's ``/logs`` has no offset, so a reopened stream (after an API-server outage, or on a restarted
triggerer) reads the log from its start and skips the lines the task log already has
(`npa_airflow/burst/joblog.py`). For a finished job of N lines of 100 bytes on SkyPilot's Slurm infra on the local
cluster, this times a resume after the last line (the whole log read and skipped: the most a resume costs), the
one-line read a finished followed log ends with (the floor: one request), and the follower's own share (splitting
and classifying N lines, in process).

    .venv/bin/python -m benchmarks.burst_log_resume --lines 10000,100000,500000

Needs dev/cluster and dev/skypilot (with `dev/skypilot slurm`); launches cluster npa-bench-joblog and takes it
down at the end. Nothing here is a test: figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import table
from npa_airflow.burst import client as sky
from npa_airflow.burst.client.joblog import LogStreamParser
from npa_airflow.burst.hook import SkyPilotHook
from npa_airflow.burst.joblog import JobLog, JobLogFollower, MemoryLineCount
from npa_airflow.burst.task import BurstSpec, build_task, dag_yaml

CLUSTER = "npa-bench-joblog"
SKY_SCRIPT = Path(__file__).resolve().parents[1] / "dev" / "skypilot"
LINE = "x" * 84  # with "line %010d " and the newline: 100 bytes


def _endpoint() -> str:
    out = subprocess.run([str(SKY_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    return next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("export NPA_SKY_ENDPOINT="))


async def _run_job(client: sky.AsyncSkyPilotClient, lines: int) -> int:
    """Launch (on the kept cluster) a job printing ``lines`` lines and wait for its end; its job id."""
    run = f"awk 'BEGIN {{ for (i = 1; i <= {lines}; i++) printf \"line %010d {LINE}\\n\", i }}'"
    spec = BurstSpec(
        image=None, nodes=1, accelerators="GPU:1", command="true", name="bench-joblog", infra="slurm/npa-local"
    )
    launch = sky.build_launch(client.identity, dag_yaml(build_task(spec, run)), CLUSTER)
    result = await client.call(launch, timeout=1800)
    job_id = sky.parse_launch_result(result)
    while True:
        value = await client.call(sky.build_job_status(client.identity, CLUSTER, [job_id]))
        if sky.interpret_job_state(sky.parse_job_status(value, job_id)).is_terminal:
            return job_id
        await asyncio.sleep(2)


async def _resume_after(hook: SkyPilotHook, job: JobLog, lines: int) -> tuple[float, int]:
    """Seconds for a follower that has every line to read the finished log to its end; pieces received."""
    count = MemoryLineCount()
    await count.save(job, lines + 100)  # more than SkyPilot's own lines around the job's: all are skipped
    follower = JobLogFollower(hook, job, logging.getLogger("bench.joblog"), count)
    follower.job_ended()
    started = time.perf_counter()
    await follower.run()
    return time.perf_counter() - started, follower.received


def _client_share(lines: int) -> float:
    """Seconds to split and classify ``lines`` lines as they arrive (64 KiB pieces)."""
    text = "".join(f"line {i:010d} {LINE}\n" for i in range(1, lines + 1))
    started = time.perf_counter()
    parser = LogStreamParser()
    parser.feed("Waiting for task resources on 1 node.\n")
    for at in range(0, len(text), 65536):
        parser.feed(text[at : at + 65536])
    return time.perf_counter() - started


async def measure(sizes: list[int]) -> list[list[object]]:
    endpoint = _endpoint()
    rows: list[list[object]] = []
    async with sky.AsyncSkyPilotClient(endpoint) as client:
        hook = SkyPilotHook(client=client)
        try:
            for lines in sizes:
                print(f"... {lines} lines", file=sys.stderr, flush=True)
                job = JobLog(CLUSTER, await _run_job(client, lines))
                whole, pieces = await _resume_after(hook, job, lines)
                started = time.perf_counter()
                await hook.ajob_log_end(job.cluster, job.job_id)
                floor = time.perf_counter() - started
                rows.append([lines, f"{lines * 100 / 1e6:.1f} MB", whole, floor, _client_share(lines), pieces])
        finally:
            await client.call(sky.build_down(client.identity, CLUSTER), timeout=1800)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.burst_log_resume", description=__doc__.split("\n")[0])
    parser.add_argument("--lines", default="10000,100000,500000", help="comma list of log lengths, lines")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.lines.split(",") if n.strip()]
    os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    rows = asyncio.run(measure(sizes))
    headers = ["lines", "log", "resume after the last line, s", "one-line read, s", "follower's own share, s", "pieces"]
    note = (
        "A resume reads the log from its start: its cost grows with the lines before the resume point, and is paid "
        "once per reopen (an outage, a triggerer restart), never while the stream stays open."
    )
    print(table("Burst job log: cost of a resume (SkyPilot /logs, tail=0, lines skipped)", headers, rows, note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
