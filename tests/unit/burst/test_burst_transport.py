"""The transport (burst/client/transport.py) and its blocking face (sync.py): recorded answers replayed through
httpx.MockTransport (a stand-in at the HTTP boundary only), and what is resent when.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst.client.transport import SEND_BACKOFF
from npa_airflow.exceptions import NpaConnectionError
from tests.harness.burst_doubles import replay

SAMPLES = Path(__file__).resolve().parent / "samples"


def sample(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.json").read_text())


def recorded_routes():
    return {
        ("GET", "/api/health"): [sample("health")],
        ("POST", "/queue"): [sample("queue_missing_cluster_submit")],
        ("GET", "/api/get"): [sample("queue_missing_cluster_get")],
    }


def test_sync_client_call_raises_the_servers_error():
    seen: list[httpx.Request] = []
    client = sky.SkyPilotClient("http://sky.test", token="t0k", transport=replay(recorded_routes(), seen))
    assert client.health().api_version == 62
    with pytest.raises(sky.SkyPilotApiError, match="ClusterDoesNotExist"):
        client.call(sky.build_queue(client.identity, "npa-no-such-cluster"))
    assert [r.url.path for r in seen] == ["/api/health", "/queue", "/api/get"]
    assert all(r.headers["X-SkyPilot-API-Version"] == "62" for r in seen)
    assert seen[1].headers["Authorization"] == "Bearer t0k"
    assert (
        seen[2].url.params["request_id"] == sample("queue_missing_cluster_submit")["headers"]["x-skypilot-request-id"]
    )


async def test_async_client_speaks_the_same_protocol():
    seen: list[httpx.Request] = []
    client = sky.AsyncSkyPilotClient("http://sky.test", transport=replay(recorded_routes(), seen))
    assert (await client.health()).version == "0.14.1"
    with pytest.raises(sky.SkyPilotApiError, match="ClusterDoesNotExist"):
        await client.call(sky.build_queue(client.identity, "npa-no-such-cluster"))
    assert [r.url.path for r in seen] == ["/api/health", "/queue", "/api/get"]
    assert "Authorization" not in seen[1].headers
    await client.aclose()


def test_launch_is_not_resent_after_an_ambiguous_transport_error():
    calls = []

    def handler(request):
        calls.append(request)
        raise httpx.ReadTimeout("slow", request=request)

    client = sky.SkyPilotClient("http://sky.test", retries=3, transport=httpx.MockTransport(handler))
    with pytest.raises(NpaConnectionError, match="unreachable: ReadTimeout"):
        client.submit(sky.build_launch(client.identity, "x", "c"))
    assert len(calls) == 1


RID = "63e57704-ba0f-4b9a-a7d1-74dd0df7ba6d"


@pytest.fixture
def delays(monkeypatch) -> list[float]:
    """The backoff sleeps the transport asks for (instead of sleeping)."""
    from npa_airflow.common import retry

    asked: list[float] = []

    async def record(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(retry, "apause", record)
    return asked


def answers(*statuses: int, sent: list[httpx.Request]) -> httpx.MockTransport:
    """Answer each request with the next status (a 200 carries an empty list, a request id header)."""
    queue = list(statuses)

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        status = queue.pop(0)
        return httpx.Response(status, headers={sky.REQUEST_ID_HEADER: RID}, json=[] if status == 200 else {})

    return httpx.MockTransport(handler)


async def test_429_is_retried_for_an_idempotent_request_with_growing_jittered_delays(delays):
    sent: list[httpx.Request] = []
    client = sky.AsyncSkyPilotClient("http://sky.test", retries=3, transport=answers(429, 429, 503, 200, sent=sent))
    assert await client.request_statuses([RID]) == {}
    assert len(sent) == 4
    backoff = SEND_BACKOFF
    for failures, delay in enumerate(delays, start=1):
        assert backoff.plain(failures) <= delay <= backoff.plain(failures) * (1 + backoff.jitter)
    assert delays[0] < delays[1] < delays[2]
    await client.aclose()


async def test_the_resend_delays_are_jittered(delays, monkeypatch):
    from npa_airflow.common import retry

    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)
    sent: list[httpx.Request] = []
    client = sky.AsyncSkyPilotClient("http://sky.test", retries=3, transport=answers(429, 429, 429, 200, sent=sent))
    await client.request_statuses([RID])
    assert delays == [3.0, 6.0, 12.0]  # 2, 4, 8 s stretched by the full jitter (half again)
    await client.aclose()


async def test_429_past_the_retry_budget_is_an_unreachable_server(delays):
    sent: list[httpx.Request] = []
    client = sky.AsyncSkyPilotClient("http://sky.test", retries=2, transport=answers(429, 429, 429, sent=sent))
    with pytest.raises(NpaConnectionError, match="unreachable: SkyPilotApiError: /api/status answered 429"):
        await client.request_statuses([RID])
    assert (len(sent), len(delays)) == (3, 2)
    await client.aclose()


@pytest.mark.parametrize("status", [429, 503])
async def test_a_launch_is_never_resent_once_it_may_have_reached_the_server(delays, status):
    sent: list[httpx.Request] = []
    client = sky.AsyncSkyPilotClient("http://sky.test", transport=answers(status, 200, sent=sent))
    with pytest.raises(sky.SkyPilotApiError, match=f"/launch answered {status}"):
        await client.submit(sky.build_launch(client.identity, "x", "c"))
    assert (len(sent), delays) == (1, [])
    await client.aclose()


async def test_a_launch_is_resent_when_nothing_reached_the_server(delays):
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, headers={sky.REQUEST_ID_HEADER: RID}, json=None)

    client = sky.AsyncSkyPilotClient("http://sky.test", transport=httpx.MockTransport(handler))
    assert await client.submit(sky.build_launch(client.identity, "x", "c")) == RID
    assert (len(sent), len(delays)) == (2, 1)
    await client.aclose()
