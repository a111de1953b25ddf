"""SkyPilotHook (burst/hook.py): the cancel and teardown sequence it sends, over a scripted client."""

from __future__ import annotations

import asyncio
import logging
import types
from unittest import mock

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.hook import SkyPilotHook
from tests.harness.burst_doubles import RID, ScriptedClient
from tests.harness.burst_doubles import burst_handle as handle

LOG = logging.getLogger("test")


def drive(job: BurstJobHandle, answers: list, **kwargs) -> list:
    """Cancel and tear down ``job`` against scripted answers; return the steps asked for (``("sleep", s)`` for
    each pause between teardown attempts)."""
    client = ScriptedClient(answers)

    async def pause(seconds: float) -> None:
        client.asked.append(("sleep", seconds))

    with mock.patch("npa_airflow.burst.hook.apause", pause):
        asyncio.run(SkyPilotHook(client=client).acancel_and_teardown(job, LOG, **kwargs))
    return client.asked


def paths(asked):
    return [(op, arg.path if isinstance(arg, sky.ApiRequest) else arg) for op, arg in asked]


def test_cancel_during_launch_cancels_the_request_then_downs_the_cluster():
    running = sky.RequestResult(request_id=RID, name="sky.launch", status="RUNNING")
    asked = drive(handle(), [{RID: running}, [RID], None])
    assert paths(asked) == [("statuses", [RID]), ("cancel", [RID]), ("call", "/down")]
    assert asked[2][1].body["cluster_name"] == "npa-demo-0123456789-t1"


def test_cancel_after_launch_finished_cancels_the_job_it_created():
    done = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED")
    got = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED", return_value={"job_id": 4})
    asked = drive(handle(), [{RID: done}, got, None, None])
    assert paths(asked) == [("statuses", [RID]), ("get", RID), ("call", "/cancel"), ("call", "/down")]
    assert asked[2][1].body["job_ids"] == [4]


def test_cancel_of_a_known_job_and_kept_cluster():
    asked = drive(handle(job_id=2, teardown="keep"), [None])
    assert paths(asked) == [("call", "/cancel")]


def test_without_waiting_the_cancel_and_teardown_are_only_submitted():
    """The triggerer bounds on_kill (30 s): the API server must be left to finish cancel and teardown."""
    asked = drive(handle(job_id=2), ["r-cancel", "r-down"], wait=False)
    assert paths(asked) == [("submit", "/cancel"), ("submit", "/down")]
    done = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED")
    got = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED", return_value={"job_id": 4})
    asked = drive(handle(), [{RID: done}, got, "r-cancel", "r-down"], wait=False)
    assert paths(asked) == [("statuses", [RID]), ("get", RID), ("submit", "/cancel"), ("submit", "/down")]
    assert asked[2][1].body["job_ids"] == [4]


def test_teardown_only_after_a_normal_ending_and_a_gone_cluster_is_fine():
    gone = sky.SkyPilotApiError("gone", error_type="ClusterDoesNotExist")
    asked = drive(handle(job_id=2), [gone], cancel=False)
    assert paths(asked) == [("call", "/down")]


def test_a_failed_teardown_is_retried_then_reported(caplog):
    flaky = sky.SkyPilotApiError("scancel failed", error_type="CommandError")
    asked = drive(handle(job_id=2), [flaky, None], cancel=False)
    assert paths(asked) == [("call", "/down"), ("sleep", 5.0), ("call", "/down")]
    with caplog.at_level(logging.WARNING, logger="test"):
        asked = drive(handle(job_id=2), [flaky, flaky, flaky], cancel=False)
    assert [op for op, _ in asked] == ["call", "sleep", "call", "sleep", "call"]
    assert "may still hold nodes" in caplog.text


def test_the_sync_facade_runs_the_same_sequence():
    client = ScriptedClient([None])
    SkyPilotHook(client=client).cancel_and_teardown(handle(job_id=2), LOG, cancel=False)
    assert [(op, arg.path) for op, arg in client.asked] == [("call", "/down")]


def test_the_listener_cancels_what_the_try_left_found_by_its_name_and_only_submits_the_requests():
    """The API server's cancel: the launch is found by the try's name (never from the handle's request id), the job
    cancel and the teardown are submitted (the server carries them out), the endpoint is the connection's."""
    import asyncio

    from npa_airflow import plugin
    from npa_airflow.burst import client as sky
    from npa_airflow.burst.tries import TryRef
    from npa_airflow.trusted_jobs import TaskSettings

    ref = TryRef(1, "npa-train-0123456789-t1", "npa-train-0123456789-t1")
    launch = sky.RequestResult("0123456789ab", "sky.launch", "SUCCEEDED", dag_name=ref.try_name, created_at=5.0)

    class Hook:
        done: list = []

        async def aclusters(self, names):
            return {ref.cluster: {"status": "UP"}}

        async def alaunches(self, name):
            return [launch]

        async def alaunch_result(self, request_id):
            return sky.RequestResult(request_id, "sky.launch", "SUCCEEDED", return_value={"job_id": 4})

        async def ajob_status(self, cluster, job_id):
            return "RUNNING"

        async def aconfig(self):
            return types.SimpleNamespace(endpoint="https://sky.example")

        async def acancel_and_teardown(self, handle, log, *, wait=True):
            self.done.append((handle.endpoint, handle.cluster, handle.request_id, handle.job_id, handle.teardown, wait))

    hook = Hook()
    asyncio.run(plugin._cancel_try(hook, TaskSettings("sky"), ref))
    assert hook.done == [("https://sky.example", ref.cluster, "0123456789ab", 4, "down", False)]
    hook.done.clear()
    asyncio.run(plugin._cancel_try(hook, TaskSettings("sky", teardown="keep"), ref))
    assert hook.done[0][4] == "keep"


def _sky_conn(host, schema=None, port=None, token="tok-secret"):
    return types.SimpleNamespace(
        conn_id="sky", host=host, schema=schema, port=port, password=None, extra_dejson={"token": token}
    )


@pytest.mark.parametrize(
    ("host", "schema", "port", "endpoint"),
    [
        ("sky.example.org", None, None, "https://sky.example.org"),  # no scheme: https, never http
        ("sky.example.org", None, 8443, "https://sky.example.org:8443"),
        ("sky.example.org", "http", 80, "http://sky.example.org:80"),  # http only when written
        ("http://sky.example.org:46580/", None, None, "http://sky.example.org:46580"),
        ("https://sky.example.org", None, None, "https://sky.example.org"),
    ],
)
def test_an_endpoint_without_a_scheme_is_https(host, schema, port, endpoint):
    from npa_airflow.burst.hook import SkyPilotConnectionConfig

    assert SkyPilotConnectionConfig.from_connection(_sky_conn(host, schema, port)).endpoint == endpoint


def test_plain_http_off_this_machine_warns_once_per_process(caplog, monkeypatch):
    from npa_airflow.burst import connection
    from npa_airflow.burst.hook import SkyPilotConnectionConfig

    monkeypatch.setattr(connection, "_warned_cleartext", set())
    with caplog.at_level("WARNING", logger=connection.__name__):
        for host in ("http://sky.example.org:46580", "http://sky.example.org:46580", "http://127.0.0.1:46580",
                     "http://localhost:46580", "http://[::1]:46580", "https://sky.example.org"):  # fmt: skip
            SkyPilotConnectionConfig.from_connection(_sky_conn(host))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "http://sky.example.org:46580 over plain http" in warnings[0]
    assert "tok-secret" not in warnings[0]
