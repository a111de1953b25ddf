"""BurstJobTrigger (burst/triggers.py): serialization through Airflow's trigger persistence."""

from __future__ import annotations

import json
import time

from npa_airflow.burst.triggers import BurstJobTrigger
from tests.harness.burst_doubles import burst_handle as handle


def test_trigger_serializes_to_its_constructor_kwargs():
    trigger = BurstJobTrigger(handle=handle().to_dict(), poll_interval=5, deadline=1796220000.0, nodes=2)
    classpath, kwargs = trigger.serialize()
    assert classpath == "npa_airflow.burst.triggers.BurstJobTrigger"
    again = BurstJobTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert kwargs["cancel_on_kill"] is True and kwargs["nodes"] == 2


def test_trigger_goes_through_airflows_trigger_persistence():
    from airflow.models.trigger import Trigger

    trigger = BurstJobTrigger(handle=handle(job_id=1).to_dict(), poll_interval=5)
    row = Trigger.from_object(trigger)
    assert row.classpath == "npa_airflow.burst.triggers.BurstJobTrigger"
    assert BurstJobTrigger(**row.kwargs).serialize() == trigger.serialize()


def _waiting_trigger(monkeypatch, claim_in_xcom: str | None):
    """A trigger that has claimed its job, with the triggerer's supervisor channel as a stand-in (its XComs in a
    dict; the real channel: tests/e2e/test_compute_view_burst.py, where the page finds the job by this XCom)."""
    from npa_airflow.common import xcom_keys
    from npa_airflow.common.ownership import Claim
    from tests.supervisor_double import install_supervisor, run_for_task_instance

    supervisor = install_supervisor(monkeypatch, "deferred")
    trigger = run_for_task_instance(BurstJobTrigger(handle=handle().to_dict(), poll_interval=5))
    trigger._claim = Claim.new(1)
    supervisor.xcoms[xcom_keys.TRIGGER_CLAIM] = claim_in_xcom or trigger._claim.line()
    return trigger, supervisor


async def test_a_job_id_learned_from_the_launch_goes_into_the_tasks_xcom_handle(monkeypatch):
    """Without it, what reads the handle while the task waits (the Compute page, the listener's cancel) would
    see a launch without a job until the job had ended."""
    trigger, supervisor = _waiting_trigger(monkeypatch, None)
    trigger._remember(handle(job_id=7))
    await trigger._publishing
    assert supervisor.xcoms["burst_job"] == handle(job_id=7).to_dict()
    trigger._remember(handle(job_id=7))  # the same job again (a re-poll): no second write
    assert [type(m).__name__ for m in supervisor.asked].count("SetXCom") == 1


async def test_a_superseded_trigger_does_not_write_the_handle(monkeypatch):
    trigger, supervisor = _waiting_trigger(monkeypatch, "1 0123456789abcdef")
    trigger._remember(handle(job_id=7))
    await trigger._publishing
    assert "burst_job" not in supervisor.xcoms


async def test_on_kill_reads_for_the_shared_decide_bound_then_leaves_a_deferred_task_alone(monkeypatch, capsys):
    """The same bound as the Slurm trigger's (common/ownership.py DECIDE_SECONDS): the trigger may have moved."""
    from npa_airflow.common import ownership

    monkeypatch.setattr(ownership, "DECIDE_SECONDS", 0.3)
    monkeypatch.setattr(ownership, "DECIDE_PAUSE", 0.1)
    trigger, supervisor = _waiting_trigger(monkeypatch, None)
    hooks = []
    monkeypatch.setattr(trigger, "_hook", lambda: hooks.append(1))
    start = time.monotonic()
    await trigger.on_kill()
    assert time.monotonic() - start < 5, "the bound is the shared one, not a Burst one of its own"
    assert hooks == [], "nothing is cancelled"
    assert [type(m).__name__ for m in supervisor.asked].count("GetTaskStates") >= 2, "re-read before giving up"
    assert "(undecided)" in capsys.readouterr().out  # the trigger's log
