"""The job handle (burst/handle.py): JSON round trip and validation of every field."""

from __future__ import annotations

import json

import pytest

from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.exceptions import NpaValidationError
from tests.harness.burst_doubles import burst_handle as handle


def test_handle_round_trips_through_json():
    h = handle(job_id=3)
    assert BurstJobHandle.from_json(h.to_json()) == h
    assert BurstJobHandle.from_dict(json.loads(json.dumps(h.to_dict()))) == h
    assert h.to_dict()["job_id"] == 3


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"cluster": "Bad Cluster"}, "cluster"),
        ({"request_id": "x; rm"}, "request_id"),
        ({"job_id": -1}, "job_id"),
        ({"job_id": True}, "job_id"),
        ({"endpoint": "127.0.0.1:46580"}, "endpoint"),
        ({"teardown": "stop"}, "teardown"),
        ({"conn_id": "a b"}, "conn_id"),
    ],
)
def test_handle_validates_every_field(overrides, field):
    with pytest.raises(NpaValidationError, match=f"BurstJobHandle.{field}="):
        handle(**overrides)


def test_handle_from_dict_refuses_unknown_and_missing_fields():
    with pytest.raises(NpaValidationError, match="unknown fields"):
        BurstJobHandle.from_dict({**handle().to_dict(), "password": "x"})
    with pytest.raises(NpaValidationError, match="lacks"):
        BurstJobHandle.from_dict({"conn_id": "c"})
    with pytest.raises(NpaValidationError, match="not JSON"):
        BurstJobHandle.from_dict("{nope")
