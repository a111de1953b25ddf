"""The one event shape of both backends' triggers (common/trigger_events.py)."""

from __future__ import annotations

import pytest

from npa_airflow.common.trigger_events import check_event, make_event

STATUSES = ("success", "failed")


def test_an_event_is_status_handle_message_and_what_the_backend_adds():
    event = make_event("Slurm", STATUSES, "failed", {"job_id": "4"}, "it failed", exit_code=3)
    assert event == {"status": "failed", "handle": {"job_id": "4"}, "message": "it failed", "exit_code": 3}
    assert check_event(event, "Slurm", STATUSES) is event
    with pytest.raises(ValueError, match="unknown burst trigger event status 'weird'"):
        make_event("burst", STATUSES, "weird", {}, "x")


@pytest.mark.parametrize(
    "event, says",
    [
        (["success"], "burst trigger event must be a dict"),
        ({"status": "success", "handle": {}}, r"lacks \['message', 'job_id'\]"),
        ({"status": "success", "handle": {}, "message": ""}, r"lacks \['job_id'\]"),
        ({"status": "weird", "handle": {}, "message": "", "job_id": "1"}, "unknown status 'weird'"),
    ],
)
def test_a_malformed_event_is_refused_naming_what_is_wrong(event, says):
    with pytest.raises(ValueError, match=says):
        check_event(event, "burst", STATUSES, keys=("status", "handle", "message", "job_id"))
