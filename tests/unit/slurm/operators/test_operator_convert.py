"""SlurmSqshConvertOperator and its trigger: target paths, the QOS memory hold.

The QOS cases feed poll results to the real trigger loop and use a recording stand-in for the hook: the local
cluster does not enforce QOS limits (AccountingStorageEnforce is off), so a job pending on QOSGrpMemLimit
cannot be produced there.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.convert_trigger import SqshConvertTrigger
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.operators import SlurmSqshConvertOperator
from npa_airflow.slurm.poller import PollUpdate, Registration
from tests.harness.slurm_operator_doubles import CFG_WITH_EXTRAS as CFG


class RecordingHook:
    """Stands in for SlurmHook where the cluster cannot produce the state under test."""

    def __init__(self) -> None:
        self.config = CFG
        self.cancelled: list[str] = []

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def _info(state: JobState, native: str, reason: str | None) -> SlurmJobInfo:
    return SlurmJobInfo("42", native, state, None, None, "npa-x-0123456789-t1", None, reason, "squeue")


def _handle() -> SlurmJobHandle:
    return SlurmJobHandle(
        conn_id="slurm_default",
        cluster=None,
        job_id="42",
        job_name="npa-x-0123456789-t1",
        login_host="login1:22",
        results_dir="/lustre/sqsh",
        stdout_path="/lustre/results/slurm-logs/x.out",
        stderr_path="/lustre/results/slurm-logs/x.err",
        try_number=1,
        retry_of=None,
        submitted_at=1.0,
    )


def _trigger() -> SqshConvertTrigger:
    return SqshConvertTrigger(handle=_handle().to_dict(), conn_id="slurm_default", poll_interval=2.0)


async def _first_event(trigger: SqshConvertTrigger, updates: list[PollUpdate], monkeypatch) -> dict:
    """Run the real trigger loop on a registration fed with these poll results."""
    reg = Registration(job_id="42", cursors=[], offsets_file=None, interval=2.0, submitted_at=1.0)
    for update in updates:
        reg.queue.put_nowait(update)
    poller = SimpleNamespace(register=lambda *a, **k: reg, unregister=lambda r: None)
    monkeypatch.setattr("npa_airflow.slurm.triggers.get_poller", lambda conn_id: poller)
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


def test_blocked_conversion_is_cancelled_with_the_seeds_advice(monkeypatch) -> None:
    op = SlurmSqshConvertOperator(task_id="convert", image="nvcr.io/nvidia/pytorch:24.01-py3")
    hook = RecordingHook()
    monkeypatch.setattr(op, "get_hook", lambda: hook)
    event = {
        "status": "held_by_qos",
        "job_id": "42",
        "handle": _handle().to_dict(),
        "message": "Slurm job 42 is PENDING on QOSGrpMemLimit",
        "blocked_by_qos": True,
        "reason": "QOSGrpMemLimit",
    }
    with pytest.raises(AirflowFailException) as err:
        op.execute_complete({}, event)
    assert hook.cancelled == ["42"]
    message = str(err.value)
    assert "PENDING on QOSGrpMemLimit" in message
    assert "-p cpu_long -c4 --mem=7200M" in message
    assert "Do not wait for the QOS" in message


def test_convert_target_paths() -> None:
    op = SlurmSqshConvertOperator(task_id="c", image="nvcr.io/nvidia/pytorch:24.01-py3")
    assert op.target_path(CFG) == "/lustre/sqsh/nvcr.io+nvidia+pytorch+24.01-py3.sqsh"
    op = SlurmSqshConvertOperator(task_id="c", image="ubuntu", sqsh_cache_dir="/other")
    assert op.target_path(CFG) == "/other/docker.io+library+ubuntu+latest.sqsh"
    op = SlurmSqshConvertOperator(task_id="c", image="ubuntu:22.04", target="/x/u.sqsh")
    assert op.target_path(CFG) == "/x/u.sqsh"
    op = SlurmSqshConvertOperator(task_id="c", image="/ready/pt.sqsh")
    assert op.target_path(CFG) == "/ready/pt.sqsh"
    no_cache = SlurmConnectionConfig(conn_id="c", hosts=(("h", 22),), user="u", insecure_skip_host_key_check=True)
    with pytest.raises(NpaValidationError, match="sqsh_cache_dir"):
        SlurmSqshConvertOperator(task_id="c", image="ubuntu:22.04").target_path(no_cache)


async def test_a_qos_memory_hold_has_its_own_status_and_is_cancelled_by_the_trigger(monkeypatch) -> None:
    cancelled: list[str] = []

    async def acancel(job_id: str) -> None:
        cancelled.append(job_id)

    updates = [PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "QOSGrpMemLimit"))]
    reg = Registration(job_id="42", cursors=[], offsets_file=None, interval=2.0, submitted_at=1.0)
    for update in updates:
        reg.queue.put_nowait(update)
    poller = SimpleNamespace(
        register=lambda *a, **k: reg, unregister=lambda r: None, hook=SimpleNamespace(acancel=acancel)
    )
    monkeypatch.setattr("npa_airflow.slurm.triggers.get_poller", lambda conn_id: poller)
    gen = _trigger().run()
    try:
        payload = (await anext(gen)).payload
    finally:
        await gen.aclose()
    assert payload["status"] == "held_by_qos"
    assert cancelled == ["42"]
