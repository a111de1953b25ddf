"""as_trigger_row: (classpath, kwargs) of a trigger as BaseTrigger.serialize returns them."""

from __future__ import annotations

from npa_airflow.common.trigger_rows import as_trigger_row


class BaseThing:
    def __init__(self, handle: dict, poll_interval: float, secret: str = "s") -> None:
        self.handle = handle
        self.poll_interval = poll_interval
        self.secret = secret


class SubThing(BaseThing):
    class Inner(BaseThing):
        pass


def test_the_classpath_is_the_trigger_own_class_and_kwargs_are_read_by_name():
    thing = BaseThing({"job_id": "1"}, 2.0)
    classpath, kwargs = as_trigger_row(thing, ("handle", "poll_interval"))
    assert classpath == f"{__name__}.BaseThing"
    assert kwargs == {"handle": {"job_id": "1"}, "poll_interval": 2.0}
    assert "secret" not in kwargs  # only the names asked for


def test_a_subclass_round_trips_as_itself():
    classpath, kwargs = as_trigger_row(SubThing({"a": 1}, 5.0), ["poll_interval", "handle"])
    assert classpath == f"{__name__}.SubThing"
    assert list(kwargs) == ["poll_interval", "handle"]  # in the order given
    rebuilt = SubThing(**kwargs)
    assert as_trigger_row(rebuilt, ["poll_interval", "handle"]) == (classpath, kwargs)


def test_a_nested_class_uses_its_qualified_name():
    classpath, _ = as_trigger_row(SubThing.Inner({}, 1.0), [])
    assert classpath == f"{__name__}.SubThing.Inner"


def test_values_are_read_at_call_time():
    thing = BaseThing({}, 1.0)
    thing.poll_interval = 9.0
    assert as_trigger_row(thing, ["poll_interval"])[1] == {"poll_interval": 9.0}


def test_a_typed_value_is_stored_as_its_dict():
    class Handle:
        def to_dict(self) -> dict:
            return {"job_id": "7"}

    _, kwargs = as_trigger_row(BaseThing(Handle(), 1.0), ["handle", "poll_interval"])
    assert kwargs == {"handle": {"job_id": "7"}, "poll_interval": 1.0}
