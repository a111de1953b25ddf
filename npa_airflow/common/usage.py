"""A job's GPU-hours, Slurm's and Burst's: what it was given and how long it ran (`JobUsage`), read back from an
event (`event_usage`), and the one task-log line that reports it (`usage_line`). XCom ``npa_usage`` holds
:meth:`JobUsage.to_dict`, or None when the usage is unknown.

Importing this module is cheap (no provider I/O): the operators of both backends import it at DAG parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Why an event's usage is None: its wait ended (a deadline, a reason that never clears, a lost job) before the job's
# end was recorded.
ENDED_FIRST = "the wait ended before the job's end was recorded"


@dataclass(frozen=True)
class JobUsage:
    """What a job was allocated and how long it ran.

    Slurm: sacct's AllocTRES and ElapsedRaw (a pending job has none of either: 0, 0, 0; a running one's elapsed
    time counts up to the sacct that read it). Burst: the job's accelerators and nodes and its run time as the
    SkyPilot API server's job queue records it (``burst/usage.py``).
    """

    gpus: int  # every node's GPUs together (every type); 0 = no GPU
    nodes: int
    elapsed_seconds: int

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_seconds / 3600

    def to_dict(self) -> dict[str, int | float]:
        """The JSON shape of trigger events and XCom ``npa_usage``."""
        return {
            "gpus": self.gpus,
            "nodes": self.nodes,
            "elapsed_seconds": self.elapsed_seconds,
            "gpu_hours": self.gpu_hours,
        }


def event_usage(event: dict[str, Any]) -> tuple[JobUsage | None, str]:
    """The usage a checked event carries, and why it is unknown when it is (an event of an earlier release, or
    one that is not readable, has none)."""
    usage = event.get("usage")
    counts = [usage.get(k) for k in ("gpus", "nodes", "elapsed_seconds")] if isinstance(usage, dict) else []
    if len(counts) == 3 and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return JobUsage(*counts), ""
    return None, str(event.get("usage_unknown") or "the wait reported none")


def usage_line(usage: JobUsage | None, unknown: str) -> str:
    """``GPU usage: 2.13 GPU-hours (16 GPUs on 2 nodes x 8 min 0 s)``, or ``GPU usage: unknown (<why>)``."""
    if usage is None:
        return f"GPU usage: unknown ({unknown})"
    gpus = f"{usage.gpus} GPU" + ("" if usage.gpus == 1 else "s")
    nodes = f"{usage.nodes} node" + ("" if usage.nodes == 1 else "s")
    return f"GPU usage: {usage.gpu_hours:.2f} GPU-hours ({gpus} on {nodes} x {duration_text(usage.elapsed_seconds)})"


def duration_text(seconds: int) -> str:
    """``20 s``, ``8 min 0 s``, ``26 h 3 min 0 s``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min {secs} s"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
