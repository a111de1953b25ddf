"""BurstJobTrigger (burst/triggers.py): serialization through Airflow's trigger persistence."""

from __future__ import annotations

import json

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
