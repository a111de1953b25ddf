"""What the cluster's own accounting says about jobs, read over the test SSH helper (`cluster_ssh`).

On a cluster without accounting (the bed `dev/cluster --no-accounting`: sacct says "accounting storage is
disabled") the same questions go to slurmctld, `squeue -t all`, which knows a job only until MinJobAge after its end
(30 s on that bed): enough for the job a test just ran, never a history.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def sacct_jobs(cluster_ssh: Callable[..., Any], name_prefix: str) -> list[dict[str, str]]:
    """Every job (allocations only) of the last two hours whose name starts with ``name_prefix`` (without
    accounting: those slurmctld still knows)."""
    result = cluster_ssh("sacct -X -n --parsable2 --starttime=now-2hours -o JobID,JobName,State,NodeList")
    if result.returncode != 0 and "accounting storage is disabled" in result.stderr:
        result = cluster_ssh("squeue -h -t all -o '%i|%j|%T|%N'")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    jobs = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[1].startswith(name_prefix):
            jobs.append({"id": parts[0], "name": parts[1], "state": parts[2].split()[0], "nodes": parts[3]})
    return jobs


def accounted_jobs(cluster_ssh: Callable[..., Any], name_prefix: str, timeout: float = 30) -> list[dict[str, str]]:
    """Like sacct_jobs, but waits out accounting lag until at least one job is recorded."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = sacct_jobs(cluster_ssh, name_prefix)
        if jobs or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


LIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING", "RESIZING")


def accounted_usage(cluster_ssh: Callable[..., Any], job_id: str, timeout: float = 60) -> tuple[dict[str, int], int]:
    """sacct's own AllocTRES ({name: count}, counts only) and ElapsedRaw of an ended job, once accounting has its
    end (waits out the lag)."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster_ssh(f"sacct -X -n -P -j {job_id} -o State,AllocTRES,ElapsedRaw", check=True).stdout
        state, _, rest = (out.strip().splitlines() or [""])[0].partition("|")
        alloc, _, elapsed = rest.partition("|")
        if state and state.split()[0] not in LIVE_STATES and elapsed.isdigit():
            pairs = (pair.partition("=") for pair in alloc.split(","))
            return {name: int(count) for name, _, count in pairs if count.isdigit()}, int(elapsed)
        assert time.monotonic() < deadline, f"accounting never recorded the end of job {job_id}: {out!r}"
        time.sleep(1)
