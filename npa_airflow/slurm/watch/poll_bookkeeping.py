"""The poller's bookkeeping: claim new registrations, load and persist their log offsets, and account for the
secret files of ended jobs (shredded in the poller's tail command).

A mixin of :class:`npa_airflow.slurm.watch.poller.SlurmPoller` (it shares the poller's hook, registrations and stats);
the shell it runs is built in :mod:`npa_airflow.slurm.commands.offsets`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from npa_airflow.common.retry import apause
from npa_airflow.slurm.commands.offsets import (
    build_commit_offsets,
    build_read_offsets,
    build_write_claims,
    parse_read_offsets,
)

if TYPE_CHECKING:
    from npa_airflow.slurm.watch.poll_records import PollerStats, Registration

log = logging.getLogger("npa_airflow.slurm.watch.poller")
MAX_SHRED_ATTEMPTS = 3  # cycles whose command failed while a finished job's secret files waited to be removed
CLAIM_READ_TIMEOUT = 10.0  # one read of a job's claim (here and in a trigger's on_kill)
CLAIM_REREADS = 3  # a claim read that is itself late this many times in a row: write (the loop is too slow to tell)


def claim_fresh_seconds() -> float:
    """How long a claim read stays good enough to write by: a third of [triggerer]
    triggerer_health_check_threshold (Airflow's default 30 s), which a holder's heartbeat must be older than
    before another triggerer takes its triggers."""
    try:
        from airflow.configuration import conf

        threshold = conf.getfloat("triggerer", "triggerer_health_check_threshold", fallback=30.0)
    except Exception:  # no Airflow configuration (a bare test loop): Airflow's default
        threshold = 30.0
    return max(1.0, threshold / 3)


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


class OffsetBookkeeping:
    """Claims and persisted offsets of a poller's registrations (see the module docstring)."""

    hook: Any
    channel: Any
    stats: PollerStats
    claim_fresh_for: float
    _registrations: list[Registration]

    async def claim_still_held(self, reg: Registration, read_at: float | None) -> bool:
        """Whether `reg` may write lines a cycle fetched after reading its claim at `read_at` (monotonic).

        A triggerer that stood still between that read and the writing (SIGSTOP, swap, a long pause) may have been
        taken over meanwhile: the other triggerer resumed from the persisted offsets and writes the same lines. A
        read older than a third of the triggerer health-check threshold (the least time a takeover needs) is
        made again first; the reads of many triggers share one command (KillBatch).
        """
        if reg.claim is None or not reg.claim_file or read_at is None:
            return not reg.superseded
        for _ in range(CLAIM_REREADS):
            if reg.superseded or time.monotonic() - read_at <= self.claim_fresh_for:
                break
            read_at = time.monotonic()
            try:
                current = await asyncio.wait_for(self.channel.kills.read_claim(reg.claim_file), CLAIM_READ_TIMEOUT)
            except Exception as exc:
                log.warning("Could not read the claim on Slurm job %s again (%s)", reg.job_id, describe_error(exc))
                continue
            reg.note_claim(current)
        return not reg.superseded

    async def flush_offsets(self, reg: Registration, timeout: float = 10.0) -> None:
        """Persist `reg`'s committed offsets now (graceful trigger exit); best effort, bounded."""
        if not reg.offsets_file or not reg.cursors or not reg.offsets_loaded:
            return
        if all(c.committed == c.persisted for c in reg.cursors):
            return
        cmd = build_commit_offsets([(reg.offsets_file, reg.offsets_payload())], reg.commit_guard())
        try:
            await asyncio.wait_for(self.hook.arun(cmd, timeout=timeout, check=False), timeout)
            for c in reg.cursors:
                c.persisted = c.committed
        except Exception as exc:  # never let a bookkeeping write fail the trigger
            log.warning("Could not persist log offsets to %s: %s", reg.offsets_file, describe_error(exc))

    async def persist_delivered(self, wait: float = 1.0) -> None:
        """Once the triggers have written this cycle's lines, persist their offsets in ONE command.

        Runs only after cycles that delivered log bytes. Without it the offsets would reach the cluster with
        the next cycle's tail, and a triggerer killed in between would log the same lines again on restart.
        """
        waiting = [r for r in self._registrations if r.offsets_file and r.delivered_cycle > r.acked_cycle]
        if not waiting:
            return
        deadline = time.monotonic() + wait
        while waiting and time.monotonic() < deadline:
            await apause(0.01)
            waiting = [r for r in waiting if r in self._registrations and r.delivered_cycle > r.acked_cycle]
        dirty = [
            r
            for r in self._registrations
            if r.offsets_file
            and r.offsets_loaded
            and not r.superseded
            and any(c.committed != c.persisted for c in r.cursors)
        ]
        if not dirty:
            return
        written = [(r, {c.path: c.committed for c in r.cursors}) for r in dirty]
        guards = {path: guard for r in dirty for path, guard in r.commit_guard().items()}
        command = build_commit_offsets([(r.offsets_file or "", r.offsets_payload()) for r in dirty], guards)
        self.stats.offset_commits += 1
        try:
            result = await self.hook.arun(command, timeout=30, check=False)
        except Exception as exc:  # the next tail command carries them instead
            log.warning("Could not persist log offsets (%s); will retry with the next poll", describe_error(exc))
            return
        if result.returncode is None:
            return
        for reg, offsets in written:
            for cursor in reg.cursors:
                cursor.persisted = offsets.get(cursor.path, cursor.persisted)

    async def _claim_and_load_offsets(self, regs: Sequence[Registration]) -> None:
        """ONE command for the registrations new since the last cycle: write their claims, read their offsets."""
        claiming = [r for r in regs if r.claim and r.claim_file and not r.claimed]
        pending = [r for r in regs if not r.offsets_loaded and r.offsets_file]
        if not claiming and not pending:
            return
        files = [r.offsets_file for r in pending if r.offsets_file]
        parts = []
        if claiming:
            parts.append(build_write_claims([(r.claim_file or "", r.claim) for r in claiming if r.claim]))
        if files:
            parts.append(build_read_offsets(files))
        self.stats.offset_loads += 1
        try:
            result = await self.hook.arun("; ".join(parts), timeout=60, check=False)
        except Exception as exc:
            log.warning("Could not claim jobs or read persisted log offsets (%s); will retry", describe_error(exc))
            return
        if result.returncode is None:
            return
        for reg in claiming:
            reg.claimed = True
        loaded = parse_read_offsets(result.stdout, files)
        for reg in pending:
            saved = loaded.get(reg.offsets_file or "", {})
            for cursor in reg.cursors:
                start = max(cursor.committed, saved.get(cursor.path, 0))
                cursor.read = cursor.committed = cursor.persisted = start
            reg.offsets_loaded = True

    def _shredded(self, regs: Sequence[Registration]) -> None:
        for reg in regs:
            if not reg.shredded:
                reg.shredded = True
                self.stats.files_shredded += len(reg.shred_on_end)

    @staticmethod
    def _shred_failed(regs: Sequence[Registration], exc: BaseException) -> None:
        for reg in regs:
            if reg.shredded:
                continue
            reg.shred_attempts += 1
            if reg.shred_attempts >= MAX_SHRED_ATTEMPTS:
                log.warning(
                    "Slurm job %s ended but its secret files %s could not be removed (%s); remove them by hand",
                    reg.job_id,
                    ", ".join(reg.shred_on_end),
                    describe_error(exc),
                )
