"""The records of the poll cycle: a trigger's registration with its cluster's poller, the log cursors it holds, the
update a cycle hands it, and the poller's counters.

The poller (:mod:`npa_airflow.slurm.watch.poller`) fills them; the trigger reads its `Registration` and the
`PollUpdate`s on its queue, and reports back what it has written (`commit`, `ack`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from npa_airflow.common.states import JobState

if TYPE_CHECKING:
    from npa_airflow.common.ownership import Claim
    from npa_airflow.slurm.commands import LogChunk, SlurmJobInfo

FLOOR_SECONDS = 2.0  # never poll a cluster more often than this, whatever a trigger asks for
MAX_INTERVAL_SECONDS = 60.0  # slowest cadence (long PENDING, repeated connection failures)
FAST_WINDOW_SECONDS = 60.0  # right after submit: poll at the floor to see the first state changes quickly
LONG_PENDING_SECONDS = 300.0  # pending longer than this: poll 4x slower (pending for hours is normal)


@dataclass
class LogCursor:
    """Byte positions in one remote log file.

    `read` is the next byte to fetch (advanced by the poller as soon as bytes arrive, so nothing is fetched
    twice); `committed` is the end of what the trigger has written to the task log (persisted remotely).
    """

    path: str
    read: int = 0
    committed: int = 0
    persisted: int = -1


@dataclass(frozen=True)
class PollUpdate:
    """What one cycle learned about one registered job."""

    cycle: int
    state: JobState
    info: SlurmJobInfo | None
    chunks: tuple[LogChunk, ...] = ()
    error: str | None = None
    logs_drained: bool = True  # False while a finished job still has unread log bytes
    absent_for: float | None = None  # seconds sacct and squeue have both answered without the job, in a row
    accounting: bool = True  # False: the cluster keeps no accounting (the job's usage is never known)
    claims_read_at: float | None = None  # monotonic time the cycle's log command (claims read first) was sent

    def quiet_signature(self) -> tuple[JobState, SlurmJobInfo] | None:
        """What this update says when it carries nothing but the job's state (no log bytes, no error, not
        absent, not ended); None otherwise. A trigger is not woken for a quiet update equal to its last one.
        The usage is left out: a running job's elapsed time grows at every sacct, and only its end's is told."""
        if self.info is None or self.error or self.absent_for is not None or not self.logs_drained:
            return None
        if self.state.is_terminal or any(chunk.data for chunk in self.chunks):
            return None
        return self.state, replace(self.info, usage=None)


@dataclass(eq=False)
class Registration:
    """A trigger's subscription to one job. Hashable by identity: two triggers may watch the same job."""

    job_id: str
    cursors: list[LogCursor]
    offsets_file: str | None
    interval: float
    submitted_at: float | None
    queue: asyncio.Queue[PollUpdate] = field(default_factory=asyncio.Queue)
    state: JobState = JobState.UNKNOWN
    state_since: float = field(default_factory=time.monotonic)
    ever_started: bool = False
    absent_since: float | None = None  # monotonic start of an unbroken run of answers without the job
    offsets_loaded: bool = False
    stalled_drain_cycles: int = 0
    delivered_cycle: int = 0  # last cycle that handed this trigger log bytes
    acked_cycle: int = 0  # last cycle whose lines the trigger has written (and committed)
    claim: Claim | None = None
    claim_file: str | None = None
    claimed: bool = False  # the claim has been written to claim_file
    superseded_by: Claim | None = None  # another trigger's claim found in claim_file: publish nothing more
    last_quiet: tuple[JobState, SlurmJobInfo] | None = None  # the last quiet update published (see PollUpdate)
    shred_on_end: tuple[str, ...] = ()  # the job's secret files: removed once it has ended for good
    shredded: bool = False
    shred_attempts: int = 0
    end_record: str | None = None  # the file the job's script writes last (npa_airflow.slurm.commands.end_records)
    end_confirmations: int = 0  # squeue asks made because the end record existed while sacct had no end
    end_next_ask: float = 0.0  # monotonic time before which an unconfirmed end record is not asked about again

    def watched_end_record(self, now: float) -> str | None:
        """The end record to look for in the next state query: until the job is seen ended (a test in the sacct's
        command, no RPC), unless an unconfirmed ask is being waited out. Not only while it runs: accounting that
        stalled before the job's start says PENDING to its end."""
        due = not self.state.is_terminal and now >= self.end_next_ask
        return self.end_record if due else None

    @property
    def superseded(self) -> bool:
        return self.superseded_by is not None

    def note_claim(self, current: Claim | None) -> None:
        """The claim now in `claim_file`: another trigger's supersedes this registration (it publishes nothing more)."""
        if current is not None and self.claim is not None and current.token != self.claim.token:
            self.superseded_by = current

    @property
    def shred_pending(self) -> bool:
        """The job has ended and its secret files are still to be removed (a requeued job is PENDING, not ended)."""
        return bool(self.shred_on_end) and not self.shredded and self.state.is_terminal

    def commit_guard(self) -> dict[str, tuple[str, Claim]]:
        """The guard that keeps this registration's offsets write to while its claim stands (see the builder)."""
        if self.claimed and self.claim is not None and self.claim_file and self.offsets_file:
            return {self.offsets_file: (self.claim_file, self.claim)}
        return {}

    def ack(self, cycle: int) -> None:
        """The trigger has written everything of `cycle` to the task log."""
        self.acked_cycle = max(self.acked_cycle, cycle)

    def commit(self, path: str, offset: int) -> None:
        """Record that the task log now holds `path` up to byte `offset` (persisted on the next cycle)."""
        for cursor in self.cursors:
            if cursor.path == path and offset > cursor.committed:
                cursor.committed = offset

    def offsets_payload(self) -> str:
        return json.dumps({c.path: c.committed for c in self.cursors}, sort_keys=True)

    def desired_interval(self, now_wall: float, now_mono: float, floor: float = FLOOR_SECONDS) -> float:
        """The cadence this job wants; `floor` is the poller's (never faster than it)."""
        if self.state.is_terminal:  # only its log is left to drain: fetch the rest quickly
            return floor
        if self.submitted_at is not None and now_wall - self.submitted_at < FAST_WINDOW_SECONDS:
            return floor
        if self.state is JobState.PENDING and now_mono - self.state_since > LONG_PENDING_SECONDS:
            return min(MAX_INTERVAL_SECONDS, self.interval * 4)
        return self.interval


@dataclass
class PollerStats:
    """Counters that let tests prove coalescing without timing anything."""

    cycles: int = 0
    state_queries: int = 0
    log_queries: int = 0
    offset_loads: int = 0
    offset_commits: int = 0
    failures: int = 0
    files_shredded: int = 0
    updates_withheld: int = 0  # quiet updates equal to the trigger's last one: not published
    end_confirmations: int = 0  # jobs asked to squeue because their end record existed while sacct had no end
    ended_before_accounting: int = 0  # of those, jobs squeue settled as COMPLETED
    max_jobs_per_query: int = 0
    last_query_job_ids: tuple[str, ...] = ()
