"""The kill decision: a move never cancels, a user's action does, and doubt leaves the job alone."""

from __future__ import annotations

import types

import pytest

from npa_airflow.common.ownership import Claim, TaskView, Verdict, decide, kill_verdict, read_task_view

MINE = Claim(2, "a" * 16)


@pytest.mark.parametrize(
    ("current", "task", "verdict"),
    [
        # another trigger of the same try holds the job: moved, whatever the database says
        (Claim(2, "b" * 16), TaskView("deferred"), Verdict.MOVED),
        (Claim(2, "b" * 16), TaskView("failed"), Verdict.MOVED),
        (Claim(2, "b" * 16), None, Verdict.MOVED),
        # a later try holds it: the task was cleared
        (Claim(3, "b" * 16), TaskView("deferred"), Verdict.CANCEL),
        # still ours (or unreadable): the task instance's state decides
        (MINE, TaskView("failed"), Verdict.CANCEL),
        (MINE, TaskView("success"), Verdict.CANCEL),
        (MINE, TaskView(None), Verdict.CANCEL),
        (None, TaskView("up_for_retry"), Verdict.CANCEL),
        (MINE, TaskView("deferred"), Verdict.UNDECIDED),
        (None, TaskView("deferred"), Verdict.UNDECIDED),
        (None, None, Verdict.UNDECIDED),
        # an older try's claim left behind says nothing about this one
        (Claim(1, "b" * 16), TaskView("deferred"), Verdict.UNDECIDED),
        # a later try has started (the operator recorded it): this try was cleared, even if deferred again
        (MINE, TaskView("deferred", waiting_try=3), Verdict.CANCEL),
        (MINE, TaskView("deferred", waiting_try=2), Verdict.UNDECIDED),
        (Claim(2, "b" * 16), TaskView("deferred", waiting_try=3), Verdict.MOVED),
    ],
)
def test_kill_verdict(current, task, verdict):
    got, why = kill_verdict(MINE, current, task)
    assert got is verdict, why
    assert why


def test_without_a_claim_of_its_own_only_the_database_decides():
    assert kill_verdict(None, Claim(1, "b" * 16), TaskView("deferred"))[0] is Verdict.UNDECIDED
    assert kill_verdict(None, Claim(1, "b" * 16), TaskView("failed"))[0] is Verdict.CANCEL


@pytest.mark.parametrize("text", ["", "2", "x abc", "2 abc def", "2 ab-cd", b"\xff\xfe", None])
def test_damaged_claims_parse_to_none(text):
    assert Claim.parse(text) is None


def test_claim_round_trip_and_unique_tokens():
    claim = Claim.new(3)
    assert Claim.parse(claim.line() + "\n") == claim
    assert Claim.new(3).token != claim.token


async def test_decide_reads_again_until_the_state_changes():
    reads = iter([TaskView("deferred"), TaskView("deferred"), TaskView("failed")])
    seen = []

    async def observe():
        seen.append(1)
        return MINE, next(reads)

    verdict, _ = await decide(observe, MINE, bound=5, pause=0.01)
    assert verdict is Verdict.CANCEL and len(seen) == 3


async def test_decide_gives_up_undecided_within_its_bound():
    async def observe():
        return MINE, TaskView("deferred")

    verdict, why = await decide(observe, MINE, bound=0.05, pause=0.01)
    assert verdict is Verdict.UNDECIDED and "deferred" in why


async def test_read_task_view_outside_a_triggerer_is_none(monkeypatch):
    from airflow.sdk.execution_time import task_runner

    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)
    ti = types.SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1)
    assert await read_task_view(ti) is None
    assert await read_task_view(None) is None


async def test_read_task_view_of_a_mapped_task(monkeypatch):
    from airflow.sdk.execution_time import task_runner

    class Comms:
        async def asend(self, msg):
            assert msg.map_index == 3 and msg.task_ids == ["t"]
            return types.SimpleNamespace(task_states={"r": {"t_3": "failed"}})

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Comms(), raising=False)
    ti = types.SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=3)
    assert await read_task_view(ti) == TaskView("failed")


async def test_reads_of_one_mapped_tasks_instances_share_one_request_and_only_deferred_ones_read_the_try(
    monkeypatch,
):
    """A DAG run of many waiting tasks marked failed: every on_kill reads its task instance at once."""
    import asyncio

    from airflow.sdk.execution_time import task_runner

    asked = []

    class Comms:
        async def asend(self, msg):
            asked.append(msg)
            if type(msg).__name__ == "GetXCom":
                return types.SimpleNamespace(value="2")
            return types.SimpleNamespace(task_states={"r": {"t_0": "failed", "t_1": "deferred", "t_2": None}})

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Comms(), raising=False)
    tis = [types.SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=i) for i in range(4)]
    views = await asyncio.gather(*(read_task_view(ti, try_keys=("k",)) for ti in tis))
    assert views == [TaskView("failed"), TaskView("deferred", 2), TaskView(None), None]  # index 3: not in the answer
    states = [m for m in asked if type(m).__name__ == "GetTaskStates"]
    assert len(states) == 1 and states[0].map_index is None and states[0].task_ids == ["t"]
    assert [m.map_index for m in asked if type(m).__name__ == "GetXCom"] == [1]


async def test_shielded_work_finishes_when_its_caller_is_cancelled():
    """Airflow re-cancels a trigger about once a second while its on_kill runs."""
    import asyncio

    done = []

    async def work():
        await asyncio.sleep(0.2)
        done.append(True)

    from npa_airflow.common.ownership import shielded

    caller = asyncio.ensure_future(shielded(work()))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0.3)
    assert done == [True]
