"""OffsetBookkeeping (the poller's claims and persisted log offsets), on a small host class.

The commands run for real in local bash against files in tmp_path (LocalClusterDouble); the full poller's use
of this mixin is covered in test_poller.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

from npa_airflow.common.ownership import Claim
from npa_airflow.slurm.transport.kill_batch import KillBatch
from npa_airflow.slurm.watch.poll_bookkeeping import (
    CLAIM_REREADS,
    OffsetBookkeeping,
    claim_fresh_seconds,
    describe_error,
)
from npa_airflow.slurm.watch.poller import LogCursor, PollerStats, Registration
from tests.harness.cluster_double import LocalClusterDouble


class Keeper(OffsetBookkeeping):
    def __init__(self, regs: list[Registration]) -> None:
        self.hook = LocalClusterDouble()
        self.stats = PollerStats()
        self._registrations = regs


def _reg(tmp_path: Path, name: str = "job", *, claim: bool = False, loaded: bool = False) -> Registration:
    out = str(tmp_path / f"{name}.out")
    reg = Registration(
        job_id="1",
        cursors=[LogCursor(out), LogCursor(str(tmp_path / f"{name}.err"))],
        offsets_file=out + ".npa-offsets",
        interval=1.0,
        submitted_at=None,
        offsets_loaded=loaded,
    )
    if claim:
        reg.claim, reg.claim_file = Claim.new(1), out + ".npa-owner-ti"
    return reg


def _saved(reg: Registration) -> dict:
    return json.loads(Path(reg.offsets_file or "").read_text())


def test_describe_error_names_the_type():
    assert describe_error(ConnectionError("reset")) == "ConnectionError: reset"
    assert describe_error(TimeoutError()) == "TimeoutError:"


async def test_claim_and_load_writes_claims_and_resumes_from_persisted_offsets(tmp_path):
    reg = _reg(tmp_path, claim=True)
    Path(reg.offsets_file or "").write_text(json.dumps({reg.cursors[0].path: 40}))
    reg.cursors[1].committed = 7  # already further than the file says: never wound back
    keeper = Keeper([reg])
    await keeper._claim_and_load_offsets([reg])
    assert reg.claimed and reg.offsets_loaded
    assert Claim.parse(Path(reg.claim_file or "").read_text()) == reg.claim
    assert [(c.read, c.committed, c.persisted) for c in reg.cursors] == [(40, 40, 40), (7, 7, 7)]
    assert keeper.stats.offset_loads == 1 and len(keeper.hook.commands) == 1  # ONE command for both

    await keeper._claim_and_load_offsets([reg])  # nothing new: no command
    assert len(keeper.hook.commands) == 1


async def test_claim_and_load_retries_after_a_failed_command(tmp_path):
    reg = _reg(tmp_path, claim=True)
    keeper = Keeper([reg])
    keeper.hook.fail_commands = 1
    await keeper._claim_and_load_offsets([reg])
    assert not reg.claimed and not reg.offsets_loaded
    await keeper._claim_and_load_offsets([reg])
    assert reg.claimed and reg.offsets_loaded
    assert [c.committed for c in reg.cursors] == [0, 0]  # no offsets file yet: from the start


async def test_persist_delivered_writes_dirty_offsets_in_one_command(tmp_path):
    a, b, clean = _reg(tmp_path, "a", loaded=True), _reg(tmp_path, "b", loaded=True), _reg(tmp_path, "c", loaded=True)
    a.delivered_cycle, a.acked_cycle = 3, 2  # a's trigger has not written cycle 3 yet: wait (0 s), then persist
    a.commit(a.cursors[0].path, 10)
    b.commit(b.cursors[1].path, 5)
    for c in clean.cursors:
        c.persisted = c.committed
    keeper = Keeper([a, b, clean])
    await keeper.persist_delivered(wait=0.0)
    assert keeper.stats.offset_commits == 1 and len(keeper.hook.commands) == 1
    assert _saved(a) == {a.cursors[0].path: 10, a.cursors[1].path: 0}
    assert _saved(b) == {b.cursors[0].path: 0, b.cursors[1].path: 5}
    assert not Path(clean.offsets_file or "").exists()
    assert all(c.persisted == c.committed for r in (a, b) for c in r.cursors)


async def test_persist_delivered_does_nothing_when_no_trigger_has_unacked_lines(tmp_path):
    reg = _reg(tmp_path, loaded=True)
    reg.delivered_cycle = 2
    reg.ack(2)
    reg.commit(reg.cursors[0].path, 10)
    keeper = Keeper([reg])
    await keeper.persist_delivered(wait=0.0)
    assert keeper.hook.commands == [] and keeper.stats.offset_commits == 0


async def test_persist_delivered_skips_superseded_and_unloaded_registrations(tmp_path):
    superseded, unloaded = _reg(tmp_path, "s", loaded=True), _reg(tmp_path, "u")
    superseded.superseded_by = Claim.new(2)
    for reg in (superseded, unloaded):
        reg.delivered_cycle = 1
        reg.commit(reg.cursors[0].path, 9)
    keeper = Keeper([superseded, unloaded])
    await keeper.persist_delivered(wait=0.0)
    assert keeper.hook.commands == []


async def test_persist_delivered_waits_for_the_trigger_to_write_its_lines(tmp_path):
    import asyncio

    reg = _reg(tmp_path, loaded=True)
    reg.delivered_cycle = 4
    keeper = Keeper([reg])

    async def trigger_writes() -> None:
        await asyncio.sleep(0.05)
        reg.commit(reg.cursors[0].path, 21)
        reg.ack(4)

    writer = asyncio.create_task(trigger_writes())
    await keeper.persist_delivered(wait=5.0)
    await writer
    assert _saved(reg)[reg.cursors[0].path] == 21  # what the trigger committed while persist waited


async def test_a_failed_persist_keeps_the_offsets_dirty_for_the_next_poll(tmp_path):
    reg = _reg(tmp_path, loaded=True)
    reg.delivered_cycle = 1
    reg.commit(reg.cursors[0].path, 12)
    keeper = Keeper([reg])
    keeper.hook.fail_commands = 1
    await keeper.persist_delivered(wait=0.0)
    assert reg.cursors[0].persisted != 12
    await keeper.persist_delivered(wait=0.0)
    assert reg.cursors[0].persisted == 12 and _saved(reg)[reg.cursors[0].path] == 12


async def test_flush_offsets_writes_only_what_changed(tmp_path):
    reg = _reg(tmp_path, loaded=True)
    keeper = Keeper([reg])
    reg.commit(reg.cursors[1].path, 3)
    await keeper.flush_offsets(reg)
    assert _saved(reg) == {reg.cursors[0].path: 0, reg.cursors[1].path: 3}
    assert [c.persisted for c in reg.cursors] == [0, 3]
    await keeper.flush_offsets(reg)  # nothing changed since
    assert len(keeper.hook.commands) == 1


async def test_flush_offsets_skips_a_registration_whose_offsets_were_never_loaded(tmp_path):
    reg = _reg(tmp_path)
    reg.commit(reg.cursors[0].path, 3)
    keeper = Keeper([reg])
    await keeper.flush_offsets(reg)
    assert keeper.hook.commands == []


async def test_flush_offsets_never_raises(tmp_path, caplog):
    reg = _reg(tmp_path, loaded=True)
    reg.commit(reg.cursors[0].path, 3)
    keeper = Keeper([reg])
    keeper.hook.fail_commands = 1
    await keeper.flush_offsets(reg)
    assert reg.cursors[0].persisted == -1
    assert "Could not persist log offsets" in caplog.text


async def test_flush_offsets_is_refused_by_a_claim_that_was_superseded(tmp_path):
    reg = _reg(tmp_path, claim=True)
    keeper = Keeper([reg])
    await keeper._claim_and_load_offsets([reg])
    Path(reg.claim_file or "").write_text(Claim.new(2).line() + "\n")  # a newer trigger took the job
    reg.commit(reg.cursors[0].path, 8)
    await keeper.flush_offsets(reg)
    assert not Path(reg.offsets_file or "").exists()


async def test_read_claim_reads_the_file_afresh_and_reads_together_share_one_command(tmp_path):
    """on_kill's claim read (npa_airflow.slurm.transport.kill_batch): afresh each time, one command for a batch."""
    double = LocalClusterDouble()
    kills = KillBatch(lambda: double)
    claim_file = tmp_path / "x.npa-owner-ti"
    assert await kills.read_claim(str(claim_file)) is None
    claim = Claim.new(3)
    claim_file.write_text(claim.line() + "\n")
    assert await kills.read_claim(str(claim_file)) == claim
    claim_file.write_text("damaged\n")
    assert await kills.read_claim(str(claim_file)) is None
    others = [tmp_path / f"{i}.npa-owner-ti" for i in range(3)]
    for i, path in enumerate(others):
        path.write_text(Claim(i, f"t{i}").line() + "\n")
    before = len(double.commands)
    read = await asyncio.gather(*(kills.read_claim(str(p)) for p in others))
    assert read == [Claim(i, f"t{i}") for i in range(3)] and len(double.commands) == before + 1


def _held_keeper(reg: Registration, fresh_for: float = 5.0) -> Keeper:
    keeper = Keeper([reg])
    keeper.channel = SimpleNamespace(kills=KillBatch(lambda: keeper.hook))
    keeper.claim_fresh_for = fresh_for
    return keeper


async def test_lines_read_with_a_fresh_claim_are_written_without_reading_it_again(tmp_path):
    reg = _reg(tmp_path, claim=True)
    keeper = _held_keeper(reg)
    await keeper._claim_and_load_offsets([reg])
    before = len(keeper.hook.commands)
    assert await keeper.claim_still_held(reg, time.monotonic() - 1.0)
    assert len(keeper.hook.commands) == before


async def test_lines_read_before_a_stall_wait_for_the_claim_read_again(tmp_path):
    """The triggerer stood still after its cycle read the claims: another triggerer took the job meanwhile, so the
    lines it fetched before the stall are not its to write (the other one resumed from the persisted offsets)."""
    reg = _reg(tmp_path, claim=True)
    keeper = _held_keeper(reg)
    await keeper._claim_and_load_offsets([reg])
    stalled_read = time.monotonic() - 60.0
    assert await keeper.claim_still_held(reg, stalled_read)  # still its own claim: one read, then write
    other = Claim.new(1)
    Path(reg.claim_file or "").write_text(other.line() + "\n")
    before = len(keeper.hook.commands)
    assert not await keeper.claim_still_held(reg, stalled_read)
    assert reg.superseded_by == other and len(keeper.hook.commands) == before + 1


async def test_a_claim_that_cannot_be_read_again_gives_way_to_writing(tmp_path, caplog):
    """The re-read fails every time: after a bounded number of tries the lines are written (never withheld)."""
    reg = _reg(tmp_path, claim=True)
    keeper = _held_keeper(reg, fresh_for=0.0)
    await keeper._claim_and_load_offsets([reg])
    keeper.hook.fail_commands = 10
    assert await keeper.claim_still_held(reg, time.monotonic() - 60.0)
    assert caplog.text.count("Could not read the claim on Slurm job 1 again") == CLAIM_REREADS


async def test_a_registration_without_a_claim_writes_unless_superseded(tmp_path):
    reg = _reg(tmp_path)
    keeper = _held_keeper(reg)
    assert await keeper.claim_still_held(reg, time.monotonic() - 60.0)
    reg.superseded_by = Claim.new(1)
    assert not await keeper.claim_still_held(reg, None)


def test_a_claim_read_stays_good_for_a_third_of_the_triggerer_health_threshold(monkeypatch):
    monkeypatch.setenv("AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD", "15")
    assert claim_fresh_seconds() == 5.0
    monkeypatch.setenv("AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD", "1.5")
    assert claim_fresh_seconds() == 1.0
