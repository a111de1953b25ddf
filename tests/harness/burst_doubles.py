"""Burst test doubles: a job handle, a scripted stand-in for ``AsyncSkyPilotClient`` and replayed HTTP answers."""

from __future__ import annotations

from typing import Any

import httpx

from npa_airflow.burst import client as sky
from npa_airflow.burst.handle import BurstJobHandle

RID = "63e57704-ba0f-4b9a-a7d1-74dd0df7ba6d"  # a launch request id as the API server issues them


def burst_handle(**overrides) -> BurstJobHandle:
    """A valid handle of a launched burst job; ``overrides`` change single fields."""
    args = dict(
        conn_id="skypilot_default",
        endpoint="http://127.0.0.1:26580",
        cluster="npa-demo-0123456789-t1",
        name="demo",
        request_id=RID,
        submitted_at=1796217346.5,
    )
    args.update(overrides)
    return BurstJobHandle(**args)


class ScriptedClient:
    """Stand-in for AsyncSkyPilotClient at the HTTP boundary: every call takes the next scripted answer (an
    exception is raised) and is recorded in ``asked`` as ``(op, argument)``."""

    def __init__(self, answers: list[Any], identity: sky.Identity | None = None) -> None:
        self.answers = list(answers)
        self.identity = identity or sky.Identity()
        self.endpoint = "http://sky.test"
        self.asked: list[tuple[str, Any]] = []
        self.calls = 0

    def _answer(self, op: str, arg: Any) -> Any:
        self.calls += 1
        self.asked.append((op, arg))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def request_statuses(self, request_ids):
        return self._answer("statuses", list(request_ids))

    async def cancel_requests(self, request_ids):
        return self._answer("cancel", list(request_ids))

    async def get(self, request_id, *, timeout=None):
        return self._answer("get", request_id)

    async def call(self, request, *, timeout=None):
        return self._answer("call", request)

    async def submit(self, request):
        return self._answer("submit", request)

    async def cluster_requests(self, cluster):
        return self._answer("requests", cluster)

    async def stream_lines(self, request, *, timeout=None):
        for line in self._answer("stream", request):
            yield line


def replay(routes: dict[tuple[str, str], list[dict]], seen: list[httpx.Request]) -> httpx.MockTransport:
    """A transport answering each (method, path) with its next recorded answer; requests are kept in ``seen``."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        rec = routes[(request.method, request.url.path)].pop(0)
        return httpx.Response(rec["status_code"], headers=rec["headers"], json=rec["body"])

    return httpx.MockTransport(handler)
