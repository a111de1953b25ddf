"""A long run in segments: one Airflow try, several Slurm jobs in a row (pure).

The continuation contract: a job of a run with ``max_segments > 1`` sees ``NPA_CONTINUE_FILE``; a command that
checkpoints (warned by ``checkpoint_signal``) writes one line there saying where it stopped ("step 41000") and
exits. Whatever Slurm then says of the job (COMPLETED, TIMEOUT, FAILED), the file makes it a segment that ended to
be continued: the operator submits the next one, ``<first name>-s<k>-t<try>``, with the same results dir (so the
same checkpoints), until a segment ends without the file (its outcome is the task's) or ``max_segments`` is reached.

A job preempted without requeue (native state PREEMPTED) is not the program's failure: the operator resubmits it
as the next segment, up to ``max_preemptions`` times, without spending a retry (the program resumes from its
checkpoint: the preemption sent it the warning too, where the site sends it).

What the worker knows of the run between segments (`RunState`) travels in the deferral kwargs; where Airflow drops
them (``dag.test()`` resumes with the event alone) the segment number still comes from the job's name, so the cap
holds, and only the earlier segments' usage is missing from the total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npa_airflow.common.naming import segment_job_name, segment_of

CHECKPOINT_NOTE_BYTES = 200  # what of the continue file (layout.continue_file) the log shows


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass(frozen=True)
class RunState:
    """The run so far: each ended segment's usage entry, the preemptions resubmitted, the first submission."""

    usage: tuple[dict[str, Any], ...] = ()
    preemptions: int = 0
    first_submitted_at: float | None = None

    def to_kwargs(self) -> dict[str, Any]:
        """The deferral kwargs of the next segment's wait (JSON)."""
        return {
            "run": {
                "usage": list(self.usage),
                "preemptions": self.preemptions,
                "first_submitted_at": self.first_submitted_at,
            }
        }

    @classmethod
    def from_kwargs(cls, run: Any) -> RunState:
        """The state `to_kwargs` wrote (kept by Airflow with the task instance); anything malformed reads as none."""
        if not isinstance(run, dict):
            return cls()
        usage = run.get("usage")
        entries = tuple(e for e in usage if isinstance(e, dict)) if isinstance(usage, list) else ()
        first = run.get("first_submitted_at")
        first = float(first) if isinstance(first, (int, float)) and not isinstance(first, bool) else None
        return cls(entries, _count(run.get("preemptions")), first)


@dataclass(frozen=True)
class NextSegment:
    """A segment that ended to be continued, or was preempted without requeue: the next one follows."""

    handle: Any  # the ended segment's SlurmJobHandle
    run: RunState  # the run including the ended segment

    @property
    def segment(self) -> int:
        """The ended segment's number (its job name's)."""
        return segment_of(self.handle.job_name)

    @property
    def next_name(self) -> str:
        return segment_job_name(self.handle.job_name, self.segment + 1)

    def announcement(self, max_segments: int) -> str:
        """The task log's line as the next segment is submitted (a preemption's resubmission adds to the cap)."""
        most = max_segments + self.run.preemptions
        return (
            f"Submitting segment {self.segment + 1} of at most {most} ({self.next_name}) in {self.handle.results_dir}"
        )


def segment_usage_entry(segment: int, job_id: str, usage: dict[str, Any] | None, unknown: str) -> dict[str, Any]:
    """One segment's line of ``npa_usage["segments"]``."""
    if usage is None:
        return {"segment": segment, "job_id": job_id, "unknown": unknown}
    return {"segment": segment, "job_id": job_id, **usage}


def run_usage(entries: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """XCom ``npa_usage`` of a run: a single segment's usage as it is; several summed (GPU-hours and elapsed
    seconds over the known segments; GPUs and nodes the largest) with each segment's entry under "segments".
    None when no segment's usage is known."""
    known = [e for e in entries if isinstance(e.get("gpu_hours"), (int, float))]
    if not known:
        return None
    if len(entries) == 1:
        return {k: v for k, v in known[0].items() if k not in ("segment", "job_id")}
    return {
        "gpus": max(_count(e.get("gpus")) for e in known),
        "nodes": max(_count(e.get("nodes")) for e in known),
        "elapsed_seconds": sum(_count(e.get("elapsed_seconds")) for e in known),
        "gpu_hours": sum(float(e["gpu_hours"]) for e in known),
        "segments": list(entries),
    }


def checkpoint_note(raw: bytes) -> str:
    """The continue file's first line as the log shows it (printable, at most CHECKPOINT_NOTE_BYTES)."""
    text = raw[:CHECKPOINT_NOTE_BYTES].decode("utf-8", "replace").split("\n", 1)[0]
    return "".join(c if c.isprintable() else "?" for c in text).strip()
