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
writes the job's lines twice nor winds its offsets back.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from npa_airflow.common.coalesce import Coalescer
from npa_airflow.common.ownership import Claim
from npa_airflow.common.retry import Backoff, apause
from npa_airflow.common.states import JobState
from npa_airflow.slurm.end_records import END_ASK_BACKOFF
from npa_airflow.slurm.kill_batch import KillBatch
from npa_airflow.slurm.offsets import (
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
from npa_airflow.slurm.poll_bookkeeping import MAX_SHRED_ATTEMPTS, OffsetBookkeeping, describe_error

if TYPE_CHECKING:
    from npa_airflow.slurm.commands import JobQuery, LogChunk, SlurmJobInfo

log = logging.getLogger(__name__)

# Re-exported: triggers, tests and benchmarks import the offsets and claims helpers from here.
__all__ = [
    "CLAIM_SUFFIX",
    "OFFSETS_SUFFIX",
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

FLOOR_SECONDS = 2.0  # never poll a cluster more often than this, whatever a trigger asks for
MAX_INTERVAL_SECONDS = 60.0  # slowest cadence (long PENDING, repeated connection failures)
FAST_WINDOW_SECONDS = 60.0  # right after submit: poll at the floor to see the first state changes quickly
LONG_PENDING_SECONDS = 300.0  # pending longer than this: poll 4x slower (pending for hours is normal)
IDLE_STOP_SECONDS = 5.0  # the loop ends after this long without registrations
MAX_STALLED_DRAIN_CYCLES = 3  # a finished job's log that stops yielding bytes (unreadable): give up after this
TAIL_TOTAL_BYTES = 32 << 20  # per cycle, all files together: bounds the triggerer's memory at any job count
TAIL_FILE_MIN_BYTES = 64 << 10
TAIL_FILE_MAX_BYTES = 8 << 20


def tail_budget(files: int) -> int:
    """Bytes each file may return in one cycle: a share of the total, within sane per-file bounds."""
    return max(TAIL_FILE_MIN_BYTES, min(TAIL_FILE_MAX_BYTES, TAIL_TOTAL_BYTES // max(files, 1)))


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

    def quiet_signature(self) -> tuple[JobState, SlurmJobInfo] | None:
        """What this update says when it carries nothing but the job's state (no log bytes, no error, not
        absent, not ended); None otherwise. A trigger is not woken for a quiet update equal to its last one."""
        if self.info is None or self.error or self.absent_for is not None or not self.logs_drained:
            return None
        if self.state.is_terminal or any(chunk.data for chunk in self.chunks):
            return None
        return self.state, self.info


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
    end_record: str | None = None  # the file the job's script writes last (npa_airflow.slurm.end_records)
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

    def desired_interval(self, now_wall: float, now_mono: float) -> float:
        if self.state.is_terminal:  # only its log is left to drain: fetch the rest quickly
            return FLOOR_SECONDS
        if self.submitted_at is not None and now_wall - self.submitted_at < FAST_WINDOW_SECONDS:
            return FLOOR_SECONDS
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


class SlurmPoller(OffsetBookkeeping):
    """Polls one cluster (None: the connection's) for every registered job; see the module docstring.

    A `hook_factory` gets the connection id and must return a hook for this poller's cluster.
    """

    def __init__(
        self,
        conn_id: str,
        hook_factory: Callable[[str], Any] | None = None,
        *,
        autostart: bool = True,
        cluster: str | None = None,
    ) -> None:
        self.conn_id = conn_id
        self.cluster = cluster
        self.autostart = autostart  # False: the caller drives cycle() itself (tests)
        self._hook_factory = hook_factory or functools.partial(_default_hook_factory, cluster=cluster)
        self._hook: Any = None
        self._registrations: list[Registration] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consecutive_failures = 0
        self.stats = PollerStats()
        self.kills = KillBatch(lambda: self.hook)  # on_kill's reads and cancels, batched across triggers
        # Success-marker checks of the jobs that ended in one cycle (a wave of them): one command for all.
        self.path_checks: Coalescer[str, bool] = Coalescer(lambda paths: self.hook.apaths_exist(paths))

    # -- registration ------------------------------------------------------------------------------------

    @property
    def hook(self) -> Any:
        if self._hook is None:
            self._hook = self._hook_factory(self.conn_id)
        return self._hook

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
        script writes last, lets its end be seen before accounting has it (npa_airflow.slurm.end_records)."""
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
        wanted = [r.desired_interval(now_wall, now_mono) for r in self._registrations]
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
        chunks, log_error = await self._tail(tailing, [r for r in regs if r.shred_pending])
        for reg in regs:
            mine = tuple(chunks.get(id(reg), ()))
            tailed_error = log_error if reg in tailing else None
            update = self._update_for(reg, cycle_no, infos.get(reg.job_id), mine, reg in tailing, tailed_error)
            self._publish(reg, update)

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

    async def _tail(
        self, regs: Sequence[Registration], shredding: Sequence[Registration] = ()
    ) -> tuple[dict[int, list[LogChunk]], str | None]:
        """ONE command: shred the secret files of jobs that ended, persist dirty offsets, read the claims back,
        tail every log from its read cursor."""
        if not regs and not shredding:
            return {}, None
        from npa_airflow.slurm.commands import parse_tail_logs

        plan = _TailPlan.of(regs, shredding)
        self.stats.log_queries += 1
        try:
            result = await self.hook.arun(plan.script(), timeout=120, check=False)
            if result.returncode is None:
                raise ConnectionError("log tail got no exit status")
            self._shredded(shredding)
            stdout = result.stdout
            if plan.claim_files:
                claims_blob, _, stdout = stdout.partition(b"\n")
                _mark_superseded(plan.checked, parse_read_claims(claims_blob, plan.claim_files))
            parsed = parse_tail_logs(stdout, plan.requests) if plan.requests else []
        except Exception as exc:
            self._shred_failed(shredding, exc)
            return {}, f"log tail failed ({describe_error(exc)}); will retry"
        for reg, written in plan.committing:
            for cursor in reg.cursors:
                cursor.persisted = written.get(cursor.path, cursor.persisted)
        out: dict[int, list[LogChunk]] = {}
        for (reg, cursor), chunk in zip(plan.owners, parsed, strict=False):
            if chunk.offset > cursor.read or chunk.data:
                cursor.read = max(cursor.read, chunk.offset)
            out.setdefault(id(reg), []).append(chunk)
        return out, None


@dataclass
class _TailPlan:
    """What one tail command asks for, and whose cursors and claims its answer belongs to."""

    requests: list[tuple[str, int]] = field(default_factory=list)
    owners: list[tuple[Registration, LogCursor]] = field(default_factory=list)
    commits: list[tuple[str, str]] = field(default_factory=list)
    committing: list[tuple[Registration, dict[str, int]]] = field(default_factory=list)
    checked: list[Registration] = field(default_factory=list)
    shred: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, regs: Sequence[Registration], shredding: Sequence[Registration] = ()) -> _TailPlan:
        plan = cls(shred=list(dict.fromkeys(path for reg in shredding for path in reg.shred_on_end)))
        for reg in regs:
            for cursor in reg.cursors:
                plan.requests.append((cursor.path, cursor.read))
                plan.owners.append((reg, cursor))
            if reg.offsets_file and any(c.committed != c.persisted for c in reg.cursors):
                plan.commits.append((reg.offsets_file, reg.offsets_payload()))
                plan.committing.append((reg, {c.path: c.committed for c in reg.cursors}))
        plan.checked = [r for r in regs if r.claimed and r.claim_file]
        return plan

    @property
    def claim_files(self) -> list[str]:
        return [r.claim_file or "" for r in self.checked]

    def script(self) -> str:
        """Silent parts first (shred, offsets), then the claims line, then the tail frames."""
        from npa_airflow.slurm.commands import build_shred_files, build_tail_logs

        parts = []
        if self.shred:
            parts.append(build_shred_files(self.shred))
        if self.commits:
            guards = {path: guard for reg, _ in self.committing for path, guard in reg.commit_guard().items()}
            parts.append(build_commit_offsets(self.commits, guards))
        if self.claim_files:
            parts.append(build_read_claims(self.claim_files))
        if self.requests:
            parts.append(build_tail_logs(self.requests, tail_budget(len(self.requests))))
        return "; ".join(parts)


def _mark_superseded(checked: Sequence[Registration], claims: Mapping[str, Claim | None]) -> None:
    """A registration whose claim file now holds another trigger's claim publishes nothing more."""
    for reg in checked:
        current = claims.get(reg.claim_file or "")
        if current is not None and reg.claim is not None and current.token != reg.claim.token:
            reg.superseded_by = current


def _default_hook_factory(conn_id: str, cluster: str | None = None) -> Any:
    from npa_airflow.slurm.hook import SlurmHook

    return SlurmHook(slurm_conn_id=conn_id, cluster=cluster)


_PollerKey = tuple[str, "str | None"]  # (connection id, cluster)
_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_PollerKey, SlurmPoller]] = (
    weakref.WeakKeyDictionary()
)


def get_poller(
    conn_id: str, hook_factory: Callable[[str], Any] | None = None, *, cluster: str | None = None
) -> SlurmPoller:
    """The poller of `conn_id` and `cluster` (a handle's) on the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    per_loop = _POLLERS.setdefault(loop, {})
    poller = per_loop.get((conn_id, cluster))
    if poller is None:
        poller = per_loop[conn_id, cluster] = SlurmPoller(conn_id, hook_factory, cluster=cluster)
    return poller


def reset_pollers() -> None:
    """Forget every poller (tests)."""
    _POLLERS.clear()
