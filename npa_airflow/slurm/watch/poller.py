"""One batched poll per cluster for every waiting Slurm job in this process.

Triggers register a job (and its log files) with the poller of their cluster and await updates. Each cycle
issues ONE state query (`SlurmHook.aquery_jobs`: one sacct, with one squeue in the same round trip for the jobs
last seen pending (their reason is slurmctld's), and at most one more squeue for the jobs sacct cannot settle,
those whose end record appeared while accounting lags among them) for all registered jobs, and ONE
remote command that tails all their log files from their byte offsets. The same command persists the offsets
the triggers have already written to the task log in a small file next to the job's stdout
(`<stdout>.npa-offsets`), so a restarted triggerer resumes the log where it stopped at no extra cost.

Pollers are keyed by (event loop, connection id, cluster): a triggerer has one per cluster, the one its jobs'
handles record (sbatch's "id;cluster"), and each queries its jobs with that cluster's -M; `dag.test()` (a new
loop per trigger run) gets a fresh one each time. The poll loop stops by itself when nobody is registered.

Each trigger also claims its job (`npa_airflow.common.ownership`): the first command after it registers writes
its claim next to the offsets, and every tail command reads the claims back. A registration whose claim was
taken by another trigger (the task moved to another triggerer, or a later try took the job) is superseded: the
poller stops publishing to it and persisting its offsets, so a triggerer that resumes after a stall neither
writes the job's lines twice nor winds its offsets back. Lines whose cycle read the claims before a stall are
written only after the claim is read again (`claim_still_held`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from npa_airflow.common.per_loop import PerLoop
from npa_airflow.common.retry import Backoff, apause
from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands.end_records import END_ASK_BACKOFF
from npa_airflow.slurm.commands.offsets import (
    CLAIM_SUFFIX,
    OFFSETS_SUFFIX,
    build_commit_offsets,
    build_read_claims,
    build_read_offsets,
    build_write_claims,
    claim_file_for,
    offsets_file_for,
    parse_read_claims,
    parse_read_offsets,
)
from npa_airflow.slurm.transport.channel import ClusterChannel, get_channel, reset_channels
from npa_airflow.slurm.watch.log_tail import (
    TAIL_FILE_MAX_BYTES,
    TAIL_FILE_MIN_BYTES,
    TAIL_TOTAL_BYTES,
    LogTailing,
    tail_budget,
)
from npa_airflow.slurm.watch.poll_bookkeeping import (
    MAX_SHRED_ATTEMPTS,
    OffsetBookkeeping,
    claim_fresh_seconds,
    describe_error,
)
from npa_airflow.slurm.watch.poll_records import (
    FLOOR_SECONDS,
    MAX_INTERVAL_SECONDS,
    LogCursor,
    PollerStats,
    PollUpdate,
    Registration,
)

if TYPE_CHECKING:
    from npa_airflow.common.ownership import Claim
    from npa_airflow.slurm.commands import JobQuery, LogChunk, SlurmJobInfo

log = logging.getLogger(__name__)

# Re-exported: triggers, tests and benchmarks import the records, the offsets and claims helpers and the cadence
# and budget constants from here.
__all__ = [
    "CLAIM_SUFFIX",
    "OFFSETS_SUFFIX",
    "TAIL_FILE_MAX_BYTES",
    "TAIL_FILE_MIN_BYTES",
    "TAIL_TOTAL_BYTES",
    "LogCursor",
    "PollUpdate",
    "PollerStats",
    "Registration",
    "SlurmPoller",
    "build_commit_offsets",
    "build_read_claims",
    "build_read_offsets",
    "build_write_claims",
    "claim_file_for",
    "get_poller",
    "offsets_file_for",
    "parse_read_claims",
    "parse_read_offsets",
    "reset_pollers",
    "tail_budget",
]

IDLE_STOP_SECONDS = 5.0  # the loop ends after this long without registrations
MAX_STALLED_DRAIN_CYCLES = 3  # a finished job's log that stops yielding bytes (unreadable): give up after this


class SlurmPoller(LogTailing, OffsetBookkeeping):
    """Polls one cluster (None: the connection's) for every registered job; see the module docstring.

    It runs its commands through the hook of its cluster's channel (`npa_airflow.slurm.transport.channel`), which also
    carries the batches that are not polling (kills, claim reads, marker checks). Without a `channel`, one of its
    own is made from `hook_factory` (gets the connection id, returns a hook for this poller's cluster).
    """

    def __init__(
        self,
        conn_id: str,
        hook_factory: Callable[[str], Any] | None = None,
        *,
        autostart: bool = True,
        cluster: str | None = None,
        channel: ClusterChannel | None = None,
    ) -> None:
        self.conn_id = conn_id
        self.cluster = cluster
        self.autostart = autostart  # False: the caller drives cycle() itself (tests)
        self.channel = channel or ClusterChannel(conn_id, hook_factory, cluster=cluster)
        self._registrations: list[Registration] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consecutive_failures = 0
        self.stats = PollerStats()
        self.claim_fresh_for = claim_fresh_seconds()

    @property
    def hook(self) -> Any:
        """The channel's hook: the cluster's one connection."""
        return self.channel.hook

    # -- registration ------------------------------------------------------------------------------------

    @property
    def registrations(self) -> tuple[Registration, ...]:
        return tuple(self._registrations)

    def register(
        self,
        job_id: str,
        *,
        log_offsets: Sequence[tuple[str, int]] = (),
        offsets_file: str | None = None,
        interval: float = 15.0,
        submitted_at: float | None = None,
        claim: Claim | None = None,
        claim_file: str | None = None,
        shred_on_end: Sequence[str] = (),
        end_record: str | None = None,
    ) -> Registration:
        """Watch `job_id`; tail each (path, offset). With `offsets_file`, resume from its persisted offsets;
        with `claim` and `claim_file`, claim the job for this trigger (see the module docstring); `shred_on_end`
        files are shredded in the first command after the job is seen ended; `end_record`, the file the job's
        script writes last, lets its end be seen before accounting has it (npa_airflow.slurm.commands.end_records)."""
        cursors: list[LogCursor] = []
        for path, offset in log_offsets:
            if path and all(c.path != path for c in cursors):
                cursors.append(LogCursor(path=path, read=int(offset), committed=int(offset)))
        reg = Registration(
            job_id=str(job_id),
            cursors=cursors,
            offsets_file=offsets_file,
            interval=max(FLOOR_SECONDS, float(interval)),
            submitted_at=submitted_at,
            offsets_loaded=offsets_file is None or not cursors,
            claim=claim if claim_file else None,
            claim_file=claim_file if claim else None,
            shred_on_end=tuple(shred_on_end),
            end_record=end_record,
        )
        self._registrations.append(reg)
        if self.autostart:
            self._ensure_running()
        self._wake.set()
        return reg

    def unregister(self, reg: Registration) -> None:
        if reg in self._registrations:
            self._registrations.remove(reg)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            # A fresh context: the loop must not inherit the first trigger's log context (task log routing).
            loop = asyncio.get_running_loop()
            self._task = contextvars.Context().run(
                loop.create_task, self._run(), name=f"npa-slurm-poller[{self.conn_id}@{self.cluster or 'default'}]"
            )

    # -- the loop ----------------------------------------------------------------------------------------

    async def _run(self) -> None:
        idle_since: float | None = None
        while True:
            if not self._registrations:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since >= IDLE_STOP_SECONDS:
                    return
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), IDLE_STOP_SECONDS)
                except asyncio.TimeoutError:  # a distinct class before Python 3.11
                    pass
                continue
            idle_since = None
            started = time.monotonic()
            self._wake.clear()  # cleared before the cycle: a registration made during it still wakes the next one
            try:
                await self.cycle()
                await self.persist_delivered()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one cycle must not stop polling for every trigger
                log.exception("Slurm poller cycle failed for connection %s (cluster %s)", self.conn_id, self.cluster)
            delay = self._next_delay()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
                # A new registration arrived: poll soon, but never more often than the floor.
                remaining = FLOOR_SECONDS - (time.monotonic() - started)
                if remaining > 0:
                    await apause(remaining)
            except asyncio.TimeoutError:  # a distinct class before Python 3.11
                pass

    def _next_delay(self) -> float:
        if self._consecutive_failures:
            return Backoff(base=FLOOR_SECONDS * 2, cap=MAX_INTERVAL_SECONDS, jitter=0.5).delay(
                self._consecutive_failures
            )
        now_wall, now_mono = time.time(), time.monotonic()
        wanted = [r.desired_interval(now_wall, now_mono, FLOOR_SECONDS) for r in self._registrations]
        return max(FLOOR_SECONDS, min(wanted, default=MAX_INTERVAL_SECONDS))

    async def cycle(self) -> None:
        """One poll: one state query, one log command, updates fanned out to every registration."""
        regs = [r for r in self._registrations if not r.superseded]
        if not regs:
            return
        self.stats.cycles += 1
        cycle_no = self.stats.cycles
        await self._claim_and_load_offsets(regs)
        query = await self._query_states(regs, cycle_no)
        if query is None:
            return
        infos = query.states
        self._record_states(regs, infos, query.absent)
        tailing = [r for r in regs if r.cursors and r.offsets_loaded and r.ever_started]
        claims_read_at = time.monotonic()
        chunks, log_error = await self._tail(tailing, [r for r in regs if r.shred_pending])
        for reg in regs:
            mine = tuple(chunks.get(id(reg), ()))
            tailed_error = log_error if reg in tailing else None
            update = self._update_for(reg, cycle_no, infos.get(reg.job_id), mine, reg in tailing, tailed_error)
            self._publish(reg, replace(update, accounting=query.accounting, claims_read_at=claims_read_at))

    async def _query_states(self, regs: Sequence[Registration], cycle_no: int) -> JobQuery | None:
        """The ONE state query of a cycle; None (after telling every registration) when it failed."""
        job_ids = sorted({r.job_id for r in regs})
        self.stats.state_queries += 1
        self.stats.max_jobs_per_query = max(self.stats.max_jobs_per_query, len(job_ids))
        self.stats.last_query_job_ids = tuple(job_ids)
        now = time.monotonic()
        end_records = {r.job_id: path for r in regs if (path := r.watched_end_record(now))}
        # squeue (in the same round trip) only for jobs last seen pending or not seen yet: their reason is
        # slurmctld's (24.11's sacct has none), and a running job costs slurmctld no RPC.
        pending = sorted({r.job_id for r in regs if r.state in (JobState.PENDING, JobState.UNKNOWN)})
        try:
            query: JobQuery = await self.hook.aquery_jobs(
                job_ids,
                end_records=end_records,
                pending=pending,
                # a cluster without accounting settles a job slurmctld forgot from its end record
                end_record_paths={r.job_id: r.end_record for r in regs if r.end_record},
            )
        except Exception as exc:
            self._consecutive_failures += 1
            self.stats.failures += 1
            message = f"state query failed ({describe_error(exc)}); state unknown, will retry"
            for reg in regs:
                reg.absent_since = None  # only answers count towards "absent"
                self._publish(reg, PollUpdate(cycle=cycle_no, state=JobState.UNKNOWN, info=None, error=message))
            return None
        self._consecutive_failures = 0
        for reg in regs:
            if reg.job_id in query.end_records_checked:
                reg.end_confirmations += 1
                reg.end_next_ask = time.monotonic() + END_ASK_BACKOFF.plain(reg.end_confirmations)
        self.stats.end_confirmations += len(query.end_records_checked)
        self.stats.ended_before_accounting += len(query.ended_before_accounting)
        return query

    @staticmethod
    def _record_states(
        regs: Sequence[Registration], infos: Mapping[str, SlurmJobInfo], absent: frozenset[str] = frozenset()
    ) -> None:
        now = time.monotonic()
        for reg in regs:
            if reg.job_id in absent:
                reg.absent_since = reg.absent_since if reg.absent_since is not None else now
            else:
                reg.absent_since = None
            info = infos.get(reg.job_id)
            state = info.state if info is not None else JobState.UNKNOWN
            if state is not reg.state:
                reg.state, reg.state_since = state, now
            if state not in (JobState.PENDING, JobState.UNKNOWN):
                reg.ever_started = True

    @staticmethod
    def _update_for(
        reg: Registration,
        cycle_no: int,
        info: SlurmJobInfo | None,
        chunks: tuple[LogChunk, ...],
        tailed: bool,
        log_error: str | None,
    ) -> PollUpdate:
        """What this cycle tells one registration: its state, its new log bytes, whether its log is drained."""
        if reg.superseded:
            log.warning(
                "Slurm job %s: no longer watched by this triggerer (%s claimed it); its updates stop here",
                reg.job_id,
                reg.superseded_by,
            )
            return PollUpdate(cycle=cycle_no, state=JobState.UNKNOWN, info=None, error="superseded")
        drained = True
        if reg.state.is_terminal and tailed:
            unread = bool(log_error) or any(ch.offset < ch.size for ch in chunks)
            progressed = any(ch.data for ch in chunks)
            reg.stalled_drain_cycles = 0 if progressed else reg.stalled_drain_cycles + 1
            drained = not unread or reg.stalled_drain_cycles >= MAX_STALLED_DRAIN_CYCLES
        if reg.shred_pending and reg.shred_attempts < MAX_SHRED_ATTEMPTS:
            drained = False  # the trigger ends only after the secrets sidecar is gone (or removing it gave up)
        error = None
        if info is None:
            error = f"job {reg.job_id} not found by sacct or squeue yet; state unknown"
        elif log_error:
            error = log_error
        absent_for = None if reg.absent_since is None else time.monotonic() - reg.absent_since
        return PollUpdate(
            cycle=cycle_no,
            state=reg.state,
            info=info,
            chunks=chunks,
            error=error,
            logs_drained=drained,
            absent_for=absent_for,
        )

    def _publish(self, reg: Registration, update: PollUpdate) -> None:
        if reg not in self._registrations:  # unregistered mid-cycle: drop
            return
        if any(chunk.data for chunk in update.chunks):
            reg.delivered_cycle = update.cycle
        quiet = update.quiet_signature()
        if quiet is not None and quiet == reg.last_quiet:
            self.stats.updates_withheld += 1
            return  # nothing new for this trigger: do not wake it (1,000 waiting jobs, 1,000 wake-ups a cycle)
        reg.last_quiet = quiet
        reg.queue.put_nowait(update)


_POLLERS: PerLoop[tuple[str, str | None], SlurmPoller] = PerLoop()  # (connection id, cluster)


def get_poller(
    conn_id: str, hook_factory: Callable[[str], Any] | None = None, *, cluster: str | None = None
) -> SlurmPoller:
    """The poller of `conn_id` and `cluster` (a handle's) on the running event loop (created on first use), on
    the channel of that cluster (`get_channel`: `hook_factory` makes its hook when the channel is new)."""

    def make() -> SlurmPoller:
        channel = get_channel(conn_id, hook_factory, cluster=cluster)
        return SlurmPoller(conn_id, cluster=cluster, channel=channel)

    return _POLLERS.get((conn_id, cluster), make)


def reset_pollers() -> None:
    """Forget every poller and channel (tests)."""
    _POLLERS.clear()
    reset_channels()
