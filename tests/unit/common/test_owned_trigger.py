"""OwnedJobTrigger (common/owned_trigger.py): the lifecycle both backends' triggers share, on a stand-in backend."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from npa_airflow.common import owned_trigger, ownership
from npa_airflow.common.owned_trigger import OwnedJobTrigger
from npa_airflow.common.ownership import Claim, TaskView
from tests.supervisor_double import run_for_task_instance


class JobTrigger(OwnedJobTrigger):
    """A backend whose claim, task view and cancel are whatever the test sets."""

    def __init__(self, deadline: float | None = None, cancel_on_kill: bool = True) -> None:
        super().__init__(deadline, cancel_on_kill)
        self.current: Claim | None = None
        self.view: TaskView | None = TaskView("deferred")
        self.recorded: list[Claim] = []
        self.cancels: list[str] = []
        self.cancel_takes = 0.0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "tests.unit.common.test_owned_trigger.JobTrigger", {"deadline": self.deadline}

    @property
    def job_label(self) -> str:
        return "job 7"

    async def record_claim(self, ti: Any, claim: Claim) -> bool:
        self.recorded.append(claim)
        self.current = claim
        return True

    def event_payload(self, status: str, message: str, **extra: Any) -> dict[str, Any]:
        return {"status": status, "message": message, **extra}

    async def wait(self) -> dict[str, Any]:
        return self._fire("success", "job 7 ended")

    async def observe_ownership(self) -> tuple[Claim | None, TaskView | None]:
        return self.current, self.view

    async def cancel(self, why: str) -> None:
        await asyncio.sleep(self.cancel_takes)
        self.cancels.append(why)


def _fast_decisions(monkeypatch) -> None:
    monkeypatch.setattr(ownership, "DECIDE_SECONDS", 0.3)
    monkeypatch.setattr(ownership, "DECIDE_PAUSE", 0.1)


async def test_run_claims_the_job_for_its_try_then_fires_the_wait_s_event():
    trigger = run_for_task_instance(JobTrigger(), try_number=3)
    events = [event async for event in trigger.run()]
    assert [e.payload for e in events] == [{"status": "success", "message": "job 7 ended"}]
    assert [c.try_number for c in trigger.recorded] == [3] and trigger._claim == trigger.recorded[0]
    await trigger.on_kill()
    assert trigger.cancels == [], "a trigger that fired has nothing to cancel"


async def test_without_a_task_instance_nothing_is_claimed():
    trigger = JobTrigger()
    assert [e.payload["status"] async for e in trigger.run()] == ["success"]
    assert trigger.recorded == [] and trigger._claim is None


async def test_a_user_s_action_cancels_once():
    trigger = run_for_task_instance(JobTrigger())
    await trigger._claim_job()
    trigger.view = TaskView("failed")
    await asyncio.gather(trigger.on_kill(), trigger.on_kill())
    assert trigger.cancels == ["the task instance is failed"]


async def test_a_move_never_cancels(caplog):
    trigger = run_for_task_instance(JobTrigger())
    await trigger._claim_job()
    trigger.current = Claim.new(1)  # another trigger of the same try
    trigger.view = TaskView("failed")
    await trigger.on_kill()
    assert trigger.cancels == []
    assert any("Not cancelling job 7" in r.getMessage() and "(moved)" in r.getMessage() for r in caplog.records)


async def test_undecided_leaves_the_job_alone_after_the_shared_bound(monkeypatch):
    _fast_decisions(monkeypatch)
    trigger = run_for_task_instance(JobTrigger())
    await trigger._claim_job()
    start = time.monotonic()
    await trigger.on_kill()
    assert time.monotonic() - start < 5 and trigger.cancels == []


async def test_the_opt_out_cancels_nothing():
    trigger = run_for_task_instance(JobTrigger(cancel_on_kill=False))
    trigger.view = TaskView("failed")
    await trigger.on_kill()
    assert trigger.cancels == []


async def test_on_kill_is_bounded_and_logs_instead_of_raising(monkeypatch, capsys):
    monkeypatch.setattr(owned_trigger, "ON_KILL_TIMEOUT", 0.2)
    trigger = run_for_task_instance(JobTrigger())
    trigger.view, trigger.cancel_takes = TaskView("failed"), 5.0
    start = time.monotonic()
    await trigger.on_kill()
    assert time.monotonic() - start < 2 and trigger.cancels == []
    assert "Could not cancel job 7: TimeoutError" in capsys.readouterr().out  # the trigger's log


def test_the_deadline():
    assert JobTrigger()._seconds_left() is None and not JobTrigger()._deadline_passed()
    assert JobTrigger(deadline=time.time() - 1)._deadline_passed()
    assert 50 < (JobTrigger(deadline=time.time() + 60)._seconds_left() or 0) <= 60
