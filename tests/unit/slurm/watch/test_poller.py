"""The shared poller: coalescing, fan-out, failures, offsets persistence.

`LocalClusterDouble` (tests/harness/cluster_double.py) stands in for SlurmHook at the boundary: job states come
from a dict the test sets, while every shell command the poller builds runs for real in local bash.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import JobUsage
from npa_airflow.slurm.watch import log_tail
from npa_airflow.slurm.watch import poller as poller_mod
from npa_airflow.slurm.watch.poller import SlurmPoller, get_poller, offsets_file_for, reset_pollers
from tests.harness.cluster_double import LocalClusterDouble


@pytest.fixture
def double() -> LocalClusterDouble:
    return LocalClusterDouble()


@pytest.fixture(autouse=True)
def _fresh_registry():
    reset_pollers()
    yield
    reset_pollers()


def drain(reg) -> list:
    out = []
    while not reg.queue.empty():
        out.append(reg.queue.get_nowait())
    return out


async def test_n_registrations_make_one_state_query_per_cycle(double):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    regs = [poller.register(str(1000 + i)) for i in range(50)]
    for i in range(50):
        double.states[str(1000 + i)] = JobState.RUNNING if i % 2 else JobState.PENDING

    for _ in range(3):
        await poller.cycle()

    assert poller.stats.cycles == 3
    assert poller.stats.state_queries == 3
    assert len(double.state_calls) == 3  # one hook call per cycle for all 50 jobs
    assert all(sorted(call) == sorted(str(1000 + i) for i in range(50)) for call in double.state_calls)
    assert poller.stats.max_jobs_per_query == 50
    for i, reg in enumerate(regs):
        updates = drain(reg)
        assert [u.cycle for u in updates] == [1]  # cycles 2 and 3 had nothing new: the trigger was not woken
        assert updates[-1].state is (JobState.RUNNING if i % 2 else JobState.PENDING)
    assert poller.stats.updates_withheld == 100
    assert double.commands == []  # nothing started writing logs: no tail command at all


async def test_a_trigger_is_woken_only_when_its_update_says_something_new(double):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("7")
    double.states["7"], double.reasons["7"] = JobState.PENDING, "Priority"
    await poller.cycle()
    await poller.cycle()
    double.reasons["7"] = "Resources"  # a new pending reason is news
    await poller.cycle()
    double.fail_states = 1  # an error always is, and so is the quiet state after it
    await poller.cycle()
    await poller.cycle()
    double.states["7"] = JobState.RUNNING
    await poller.cycle()
    await poller.cycle()
    seen = [(u.cycle, u.state.value, u.info.reason if u.info else None, bool(u.error)) for u in drain(reg)]
    assert seen == [
        (1, "PENDING", "Priority", False),
        (3, "PENDING", "Resources", False),
        (4, "UNKNOWN", None, True),
        (5, "PENDING", "Resources", False),
        (6, "RUNNING", "Resources", False),  # the double keeps the reason
    ]


async def test_a_running_jobs_growing_elapsed_time_wakes_no_trigger_and_its_end_tells_its_usage(double):
    """sacct counts a running job's elapsed time up to each query: no news for the trigger until the job ends."""
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("7")
    double.states["7"] = JobState.RUNNING
    for elapsed in (10, 12, 14):
        double.usage["7"] = JobUsage(gpus=16, nodes=2, elapsed_seconds=elapsed)
        await poller.cycle()
    double.states["7"], double.usage["7"] = JobState.COMPLETE, JobUsage(gpus=16, nodes=2, elapsed_seconds=15)
    await poller.cycle()
    updates = drain(reg)
    assert [(u.cycle, u.state) for u in updates] == [(1, JobState.RUNNING), (4, JobState.COMPLETE)]
    assert updates[-1].info.usage == JobUsage(gpus=16, nodes=2, elapsed_seconds=15) and updates[-1].accounting
    assert poller.stats.updates_withheld == 2


async def test_an_update_says_whether_the_cluster_keeps_accounting(double):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("7")
    double.states["7"], double.accounting = JobState.COMPLETE, False
    await poller.cycle()
    (update,) = drain(reg)
    assert not update.accounting and update.info.usage is None


async def test_two_triggers_on_one_job_share_the_query_and_both_get_updates(double):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    a, b = poller.register("7"), poller.register("7")
    double.states["7"] = JobState.COMPLETE
    await poller.cycle()
    assert double.state_calls == [["7"]]
    assert drain(a)[0].state is JobState.COMPLETE
    assert drain(b)[0].state is JobState.COMPLETE


async def test_connection_drop_gives_unknown_then_recovers(double):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("5")
    double.states["5"] = JobState.RUNNING
    double.fail_states = 2
    await poller.cycle()
    await poller.cycle()
    first, second = drain(reg)
    assert first.state is JobState.UNKNOWN and "connection" in first.error
    assert second.state is JobState.UNKNOWN
    assert poller._next_delay() >= poller_mod.FLOOR_SECONDS * 4  # backing off
    await poller.cycle()
    (third,) = drain(reg)
    assert third.state is JobState.RUNNING and third.error is None
    assert poller.stats.failures == 2


async def test_missing_job_is_unknown_not_failed(double):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("404")
    await poller.cycle()
    (update,) = drain(reg)
    assert update.state is JobState.UNKNOWN
    assert update.info is None and "not found" in update.error


async def test_unregistered_mid_cycle_gets_nothing_and_others_continue(double):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    gone, stays = poller.register("1"), poller.register("2")
    double.states.update({"1": JobState.RUNNING, "2": JobState.RUNNING})

    original = double.ajob_states

    async def slow_states(ids):
        poller.unregister(gone)  # the trigger was cancelled while the query was in flight
        return await original(ids)

    double.ajob_states = slow_states
    await poller.cycle()
    assert drain(gone) == []
    assert len(drain(stays)) == 1
    await poller.cycle()
    assert double.state_calls[-1] == ["2"]


async def test_logs_are_tailed_in_one_command_and_offsets_advance(double, tmp_path):
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    files = []
    regs = []
    for i in range(3):
        out = tmp_path / f"job{i}.out"
        out.write_bytes(f"hello {i}\n".encode())
        files.append(out)
        regs.append(poller.register(str(i), log_offsets=[(str(out), 0)], offsets_file=offsets_file_for(str(out))))
        double.states[str(i)] = JobState.RUNNING

    await poller.cycle()
    # one offsets load (first cycle only) and one tail command for all three files
    assert poller.stats.offset_loads == 1 and poller.stats.log_queries == 1
    assert len(double.commands) == 2
    for i, reg in enumerate(regs):
        (update,) = drain(reg)
        assert [c.data for c in update.chunks] == [f"hello {i}\n".encode()]
        reg.commit(str(files[i]), len(f"hello {i}\n"))

    files[0].write_bytes(b"hello 0\nmore\n")
    await poller.cycle()
    assert poller.stats.log_queries == 2 and len(double.commands) == 3  # no extra round trip for offsets
    (update,) = drain(regs[0])
    assert update.chunks[0].data == b"more\n"  # only the new bytes
    assert drain(regs[1])[0].chunks[0].data == b""
    # the committed offsets of the first cycle were written by the second cycle's tail command
    for i in range(3):
        saved = json.loads(Path(offsets_file_for(str(files[i]))).read_text())
        assert saved == {str(files[i]): len(f"hello {i}\n")}


async def test_restart_resumes_from_persisted_offsets(double, tmp_path):
    out = tmp_path / "job.out"
    out.write_bytes(b"line 1\nline 2\nline 3\n")
    Path(offsets_file_for(str(out))).write_text(json.dumps({str(out): 7}))  # "line 1\n" already logged
    double.states["9"] = JobState.RUNNING
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("9", log_offsets=[(str(out), 0)], offsets_file=offsets_file_for(str(out)))
    await poller.cycle()
    (update,) = drain(reg)
    assert update.chunks[0].data == b"line 2\nline 3\n"


async def test_finished_job_with_more_log_than_one_read_is_not_drained(double, tmp_path, monkeypatch):
    monkeypatch.setattr(log_tail, "tail_budget", lambda files: 4)
    out = tmp_path / "big.out"
    out.write_bytes(b"0123456789" * 10)  # 25 reads: more cycles than any fixed drain limit would allow
    double.states["3"] = JobState.COMPLETE
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("3", log_offsets=[(str(out), 0)])
    seen = b""
    drained = False
    for _ in range(30):
        await poller.cycle()
        (update,) = drain(reg)
        seen += b"".join(c.data for c in update.chunks)
        if update.logs_drained:
            drained = True
            break
        assert update.state is JobState.COMPLETE
    assert drained and seen == b"0123456789" * 10


def test_tail_budget_bounds_a_cycle_whatever_the_job_count():
    assert poller_mod.tail_budget(1) == poller_mod.TAIL_FILE_MAX_BYTES
    assert poller_mod.tail_budget(1000) * 1000 <= poller_mod.TAIL_TOTAL_BYTES + 1000 * poller_mod.TAIL_FILE_MIN_BYTES
    assert poller_mod.tail_budget(100_000) == poller_mod.TAIL_FILE_MIN_BYTES


async def test_log_tail_failure_keeps_state_and_retries_same_offsets(double, tmp_path):
    out = tmp_path / "a.out"
    out.write_bytes(b"x\n")
    double.states["1"] = JobState.RUNNING
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("1", log_offsets=[(str(out), 0)])
    double.fail_commands = 1
    await poller.cycle()
    (update,) = drain(reg)
    assert update.state is JobState.RUNNING and "log tail failed" in update.error and update.chunks == ()
    await poller.cycle()
    (update,) = drain(reg)
    assert update.chunks[0].data == b"x\n"


async def test_registry_is_per_loop_and_connection_and_loop_stops_when_idle(double, monkeypatch):
    monkeypatch.setattr(poller_mod, "FLOOR_SECONDS", 0.01)
    monkeypatch.setattr(poller_mod, "IDLE_STOP_SECONDS", 0.05)
    other = LocalClusterDouble()
    a = get_poller("a", lambda _: double)
    b = get_poller("b", lambda _: other)
    assert get_poller("a") is a and a is not b
    double.states["1"] = JobState.RUNNING
    other.states["2"] = JobState.COMPLETE
    ra = a.register("1", interval=0.01)
    rb = b.register("2", interval=0.01)
    ua = await asyncio.wait_for(ra.queue.get(), 5)
    ub = await asyncio.wait_for(rb.queue.get(), 5)
    assert ua.state is JobState.RUNNING and ub.state is JobState.COMPLETE
    assert all(call == ["1"] for call in double.state_calls)  # clusters never mix
    assert all(call == ["2"] for call in other.state_calls)
    a.unregister(ra)
    b.unregister(rb)
    await asyncio.wait_for(a._task, 5)  # the loop ends by itself once nobody waits
    await asyncio.wait_for(b._task, 5)


def test_adaptive_interval():
    now_wall, now_mono = 10_000.0, 500.0
    reg = SlurmPoller("c", autostart=False)
    fresh = poller_mod.Registration("1", [], None, interval=30, submitted_at=now_wall - 5)
    assert fresh.desired_interval(now_wall, now_mono) == poller_mod.FLOOR_SECONDS
    running = poller_mod.Registration("2", [], None, interval=30, submitted_at=now_wall - 600)
    running.state = JobState.RUNNING
    assert running.desired_interval(now_wall, now_mono) == 30
    pending = poller_mod.Registration("3", [], None, interval=30, submitted_at=now_wall - 3600)
    pending.state, pending.state_since = JobState.PENDING, now_mono - 1000
    assert pending.desired_interval(now_wall, now_mono) == poller_mod.MAX_INTERVAL_SECONDS
    assert reg._next_delay() == poller_mod.MAX_INTERVAL_SECONDS  # nobody registered


async def test_absence_counts_only_unbroken_answers_without_the_job(double):
    """A job both tools answer they do not know is absent; a failed query or a sighting starts the count over."""
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    reg = poller.register("404")
    double.absent.add("404")
    await poller.cycle()
    (first,) = drain(reg)
    assert first.absent_for is not None  # counting from the first answer
    since = reg.absent_since
    await poller.cycle()
    (second,) = drain(reg)
    assert reg.absent_since == since and second.absent_for >= first.absent_for
    double.fail_states = 1  # the query fails: no answer, the count starts over
    await poller.cycle()
    (failed,) = drain(reg)
    assert failed.absent_for is None and reg.absent_since is None
    double.absent.clear()  # accounting did not answer (sacct down) and squeue lacks it: unknown, not absent
    await poller.cycle()
    (unknown,) = drain(reg)
    assert unknown.absent_for is None and unknown.info is None
    double.absent.add("404")
    double.states["404"] = JobState.RUNNING  # seen again
    await poller.cycle()
    (seen,) = drain(reg)
    assert seen.absent_for is None and seen.state is JobState.RUNNING


async def test_a_registration_made_during_a_cycle_is_polled_next_cycle_not_an_interval_later(double, monkeypatch):
    monkeypatch.setattr(poller_mod, "FLOOR_SECONDS", 0.01)
    monkeypatch.setattr(poller_mod, "IDLE_STOP_SECONDS", 0.05)
    double.states.update({"1": JobState.RUNNING, "2": JobState.RUNNING})
    in_cycle, go_on = asyncio.Event(), asyncio.Event()
    answer = double.ajob_states

    async def slow_states(job_ids):
        in_cycle.set()
        await go_on.wait()
        return await answer(job_ids)

    double.ajob_states = slow_states
    poller = get_poller("c1", lambda _: double)
    poller.register("1", interval=60)
    await asyncio.wait_for(in_cycle.wait(), 5)
    second = poller.register("2", interval=60)  # arrives while the first cycle's query is out
    go_on.set()
    update = await asyncio.wait_for(second.queue.get(), 5)  # not 60 s later
    assert update.state is JobState.RUNNING and poller.stats.cycles == 2
    poller._task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poller._task


async def test_a_running_jobs_end_record_is_looked_for_and_settles_it_before_accounting(double, tmp_path):
    """sacct lags (says RUNNING); the job's script has written its end record; squeue says COMPLETED."""
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    record = tmp_path / "child_exit_code"
    double.states["7"] = JobState.PENDING
    reg = poller.register("7", end_record=str(record))
    await poller.cycle()
    # Looked for while pending too (a shell test, no RPC): accounting that stalled before the start says PENDING.
    assert double.end_record_calls[-1] == {"7": str(record)}
    double.states["7"] = JobState.RUNNING
    await poller.cycle()
    await poller.cycle()
    assert double.end_record_calls[-1] == {"7": str(record)}
    assert poller.stats.end_confirmations == 0  # no record yet: nothing asked of slurmctld
    record.write_text("0\n")
    double.controller["7"] = JobState.COMPLETE
    double.usage["7"] = JobUsage(gpus=8, nodes=1, elapsed_seconds=60)  # sacct's RUNNING record, to that query
    await poller.cycle()
    ended = drain(reg)[-1]
    assert ended.state is JobState.COMPLETE and ended.info.usage == JobUsage(gpus=8, nodes=1, elapsed_seconds=60)
    assert poller.stats.end_confirmations == 1 and poller.stats.ended_before_accounting == 1
    await poller.cycle()
    assert double.end_record_calls[-1] == {}, "an ended job's record is not looked for again"


async def test_a_job_accounting_never_saw_start_is_settled_from_its_end_record(double, tmp_path):
    """slurmdbd stalled before it recorded the start (as after a slurmctld restart): sacct says PENDING from
    submission to end; the job's end record and squeue settle it."""
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    record = tmp_path / "child_exit_code"
    double.states["7"] = JobState.PENDING
    reg = poller.register("7", end_record=str(record))
    await poller.cycle()
    record.write_text("0\n")
    double.controller["7"] = JobState.COMPLETE
    await poller.cycle()
    assert drain(reg)[-1].state is JobState.COMPLETE
    assert poller.stats.ended_before_accounting == 1


async def test_an_end_record_that_slurmctld_does_not_confirm_is_asked_about_with_doubling_gaps(
    double, tmp_path, monkeypatch
):
    """The script wrote its record but has not exited yet (seconds on a loaded node), or the file is not the
    script's: squeue keeps saying RUNNING. It is asked again after 1, 2, 4 ... s (at most 120 s apart), never
    given up on, since accounting may stall for longer than any fixed number of asks."""
    clock = [1000.0]
    monkeypatch.setattr(poller_mod, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    record = tmp_path / "child_exit_code"
    record.write_text("1\n")
    double.states["7"] = JobState.RUNNING
    reg = poller.register("7", end_record=str(record))
    asked_at = []
    for _ in range(400):  # one cycle per second for 400 s
        before = poller.stats.end_confirmations
        await poller.cycle()
        if poller.stats.end_confirmations > before:
            asked_at.append(clock[0] - 1000.0)
        clock[0] += 1.0
    assert reg.state is JobState.RUNNING
    gaps = [b - a for a, b in itertools.pairwise(asked_at)]
    assert gaps[:7] == [1, 2, 4, 8, 16, 32, 64], asked_at
    assert set(gaps[7:]) == {120}, asked_at
    drain(reg)
    double.controller["7"] = JobState.COMPLETE  # the job's end, minutes after its record: still seen early
    for _ in range(121):
        await poller.cycle()
        clock[0] += 1.0
    assert JobState.COMPLETE in {update.state for update in drain(reg)}


async def test_squeue_is_asked_only_about_jobs_last_seen_pending_or_not_seen_yet(double):
    """A pending job's reason is slurmctld's (24.11's sacct has none): the state query asks squeue about those
    jobs with its sacct; a running or ended job costs slurmctld no RPC."""
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    double.states.update({"7": JobState.PENDING, "8": JobState.RUNNING})
    poller.register("7")
    poller.register("8")
    poller.register("9")  # not known to either tool yet
    await poller.cycle()
    assert double.pending_calls[-1] == ["7", "8", "9"], "nothing seen yet: all of them"
    await poller.cycle()
    assert double.pending_calls[-1] == ["7", "9"]
    double.states.update({"7": JobState.RUNNING, "9": JobState.COMPLETE})
    await poller.cycle()
    await poller.cycle()
    assert double.pending_calls[-1] == []
