"""SqshConvertTrigger: the shared Slurm job trigger plus the QOS memory hold rule (qos_memory_hold_reason).

The trigger cases feed poll results to the real trigger loop and use a recording stand-in for the hook: the
local cluster does not enforce QOS limits (AccountingStorageEnforce is off), so a job pending on QOSGrpMemLimit
cannot be produced there.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.convert_trigger import SqshConvertTrigger, qos_memory_hold_reason
from npa_airflow.slurm.submit.enroot import QOS_MEM_REASONS
from npa_airflow.slurm.transport.kill_batch import KillBatch
from npa_airflow.slurm.watch.poller import PollUpdate, Registration
from tests.harness.slurm_operator_doubles import sqsh_convert_handle


def _info(state: JobState, native: str, reason: str | None) -> SlurmJobInfo:
    return SlurmJobInfo("42", native, state, None, None, "npa-x-0123456789-t1", None, reason, "squeue")


async def _held(reg: Registration, read_at: float | None) -> bool:
    return True  # no claim in these registrations


def _trigger() -> SqshConvertTrigger:
    return SqshConvertTrigger(handle=sqsh_convert_handle().to_dict(), conn_id="slurm_default", poll_interval=2.0)


async def _first_event(trigger: SqshConvertTrigger, updates: list[PollUpdate], monkeypatch) -> dict:
    """Run the real trigger loop on a registration fed with these poll results."""
    reg = Registration(job_id="42", cursors=[], offsets_file=None, interval=2.0, submitted_at=1.0)
    for update in updates:
        reg.queue.put_nowait(update)
    poller = SimpleNamespace(register=lambda *a, **k: reg, unregister=lambda r: None, claim_still_held=_held)
    monkeypatch.setattr("npa_airflow.slurm.triggers.get_poller", lambda conn_id, **_: poller)
    gen = trigger.run()
    try:
        event = await anext(gen)
    finally:
        await gen.aclose()
    return event.payload


async def test_convert_trigger_ends_the_wait_on_a_qos_memory_block(monkeypatch) -> None:
    updates = [
        PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "Priority")),
        PollUpdate(cycle=2, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "QOSGrpMemLimit")),
    ]
    payload = await _first_event(_trigger(), updates, monkeypatch)
    assert payload["blocked_by_qos"] is True
    assert payload["reason"] == "QOSGrpMemLimit"
    assert payload["message"] == "Slurm job 42 is PENDING on QOSGrpMemLimit"
    _, kwargs = _trigger().serialize()
    assert _trigger().serialize()[0] == "npa_airflow.slurm.convert_trigger.SqshConvertTrigger"
    assert SqshConvertTrigger(**kwargs).serialize() == _trigger().serialize()


async def test_convert_trigger_waits_through_other_pending_reasons(monkeypatch) -> None:
    done = SlurmJobInfo("42", "COMPLETED", JobState.COMPLETE, 0, 0, "npa-x-0123456789-t1", "c1", None, "sacct")
    updates = [
        PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "Resources")),
        PollUpdate(cycle=2, state=JobState.RUNNING, info=_info(JobState.RUNNING, "RUNNING", None)),
        PollUpdate(cycle=3, state=JobState.COMPLETE, info=done),
    ]
    payload = await _first_event(_trigger(), updates, monkeypatch)
    assert payload["status"] == "success"
    assert "blocked_by_qos" not in payload


async def test_a_qos_memory_hold_has_its_own_status_and_is_cancelled_by_the_trigger(monkeypatch) -> None:
    cancelled: list[str] = []

    async def acancel(job_id: str, *, marker: str | None = None, shred: tuple[str, ...] = ()) -> str:
        cancelled.append(job_id)
        return "cancelled"

    updates = [PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "QOSGrpMemLimit"))]
    reg = Registration(job_id="42", cursors=[], offsets_file=None, interval=2.0, submitted_at=1.0)
    for update in updates:
        reg.queue.put_nowait(update)

    async def acancel_many(requests):
        return {r: await acancel(r.job_id, marker=r.marker, shred=r.shred) for r in requests}

    hook = SimpleNamespace(acancel=acancel, acancel_many=acancel_many)
    channel = SimpleNamespace(hook=hook, kills=KillBatch(lambda: hook))
    poller = SimpleNamespace(
        register=lambda *a, **k: reg, unregister=lambda r: None, hook=hook, channel=channel, claim_still_held=_held
    )
    monkeypatch.setattr("npa_airflow.slurm.triggers.get_poller", lambda conn_id, **_: poller)
    gen = _trigger().run()
    try:
        payload = (await anext(gen)).payload
    finally:
        await gen.aclose()
    assert payload["status"] == "held_by_qos"
    assert cancelled == ["42"]


@pytest.mark.parametrize("reason", QOS_MEM_REASONS)
def test_every_qos_memory_reason_is_a_hold(reason) -> None:
    update = PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", reason))
    assert qos_memory_hold_reason(update) == reason


def test_a_reason_that_contains_a_qos_memory_reason_is_returned_whole() -> None:
    update = PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "(QOSGrpMemLimit)"))
    assert qos_memory_hold_reason(update) == "(QOSGrpMemLimit)"


@pytest.mark.parametrize(
    "update",
    [
        None,
        PollUpdate(cycle=1, state=JobState.PENDING, info=None),
        PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", None)),
        PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "")),
        PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "QOSMaxCpuPerJob")),
        PollUpdate(cycle=1, state=JobState.RUNNING, info=_info(JobState.RUNNING, "RUNNING", "QOSGrpMemLimit")),
    ],
    ids=["no-update", "no-info", "no-reason", "blank-reason", "other-qos-limit", "not-pending"],
)
def test_anything_else_is_not_a_hold(update) -> None:
    assert qos_memory_hold_reason(update) is None
