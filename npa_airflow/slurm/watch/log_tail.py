"""The poll cycle's log command: ONE remote command per cycle that shreds the secret files of jobs that ended,
persists the offsets the triggers have written, reads the jobs' claims back and tails every log file from its
read cursor, within a byte budget for the whole cycle.

A mixin of :class:`npa_airflow.slurm.watch.poller.SlurmPoller` (it shares the poller's hook, stats and the
bookkeeping of :mod:`npa_airflow.slurm.watch.poll_bookkeeping`); the shell is built in
:mod:`npa_airflow.slurm.commands.offsets` and :mod:`npa_airflow.slurm.commands`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from npa_airflow.slurm.commands import build_shred_files, build_tail_logs, parse_tail_logs
from npa_airflow.slurm.commands.offsets import build_commit_offsets, build_read_claims, parse_read_claims
from npa_airflow.slurm.watch.poll_bookkeeping import describe_error

if TYPE_CHECKING:
    from npa_airflow.common.ownership import Claim
    from npa_airflow.slurm.commands import LogChunk
    from npa_airflow.slurm.watch.poll_records import LogCursor, PollerStats, Registration

TAIL_TOTAL_BYTES = 32 << 20  # per cycle, all files together: bounds the triggerer's memory at any job count
TAIL_FILE_MIN_BYTES = 64 << 10
TAIL_FILE_MAX_BYTES = 8 << 20


def tail_budget(files: int) -> int:
    """Bytes each file may return in one cycle: a share of the total, within sane per-file bounds."""
    return max(TAIL_FILE_MIN_BYTES, min(TAIL_FILE_MAX_BYTES, TAIL_TOTAL_BYTES // max(files, 1)))


class LogTailing:
    """The tail command of a poller's cycle (see the module docstring)."""

    hook: Any
    stats: PollerStats
    _shredded: Callable[[Sequence[Registration]], None]
    _shred_failed: Callable[[Sequence[Registration], BaseException], None]

    async def _tail(
        self, regs: Sequence[Registration], shredding: Sequence[Registration] = ()
    ) -> tuple[dict[int, list[LogChunk]], str | None]:
        """ONE command: shred the secret files of jobs that ended, persist dirty offsets, read the claims back,
        tail every log from its read cursor."""
        if not regs and not shredding:
            return {}, None

        plan = TailPlan.of(regs, shredding)
        self.stats.log_queries += 1
        try:
            result = await self.hook.arun(plan.script(), timeout=120, check=False)
            if result.returncode is None:
                raise ConnectionError("log tail got no exit status")
            self._shredded(shredding)
            stdout = result.stdout
            if plan.claim_files:
                claims_blob, _, stdout = stdout.partition(b"\n")
                mark_superseded(plan.checked, parse_read_claims(claims_blob, plan.claim_files))
            parsed = parse_tail_logs(stdout, plan.requests) if plan.requests else []
        except Exception as exc:
            self._shred_failed(shredding, exc)
            return {}, f"log tail failed ({describe_error(exc)}); will retry"
        return plan.advance(parsed), None


@dataclass
class TailPlan:
    """What one tail command asks for, and whose cursors and claims its answer belongs to."""

    requests: list[tuple[str, int]] = field(default_factory=list)
    owners: list[tuple[Registration, LogCursor]] = field(default_factory=list)
    commits: list[tuple[str, str]] = field(default_factory=list)
    committing: list[tuple[Registration, dict[str, int]]] = field(default_factory=list)
    checked: list[Registration] = field(default_factory=list)
    shred: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, regs: Sequence[Registration], shredding: Sequence[Registration] = ()) -> TailPlan:
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

    def advance(self, parsed: Sequence[LogChunk]) -> dict[int, list[LogChunk]]:
        """The command's answer applied: persisted offsets and read cursors moved on; each registration's chunks,
        by its id."""
        for reg, written in self.committing:
            for cursor in reg.cursors:
                cursor.persisted = written.get(cursor.path, cursor.persisted)
        out: dict[int, list[LogChunk]] = {}
        for (reg, cursor), chunk in zip(self.owners, parsed, strict=False):
            if chunk.offset > cursor.read or chunk.data:
                cursor.read = max(cursor.read, chunk.offset)
            out.setdefault(id(reg), []).append(chunk)
        return out


def mark_superseded(checked: Sequence[Registration], claims: Mapping[str, Claim | None]) -> None:
    """A registration whose claim file now holds another trigger's claim publishes nothing more."""
    for reg in checked:
        reg.note_claim(claims.get(reg.claim_file or ""))
