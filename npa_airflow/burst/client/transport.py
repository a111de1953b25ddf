"""The one transport to a SkyPilot API server: ``AsyncSkyPilotClient`` (httpx), resending only what is safe.

A request is resent when nothing reached the server (connect error), or, for idempotent requests (reads,
cancels), after any transport error or an answer saying the server did not run it (429, 502, 503, 504;
``remote_errors.http_status_transient``). A launch is never resent once it may have reached the server.
Delays come from :data:`SEND_BACKOFF` (jittered) within ``retries`` resends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from npa_airflow.burst.client.answers import (
    RequestResult,
    ServerInfo,
    SkyPilotApiError,
    check_compatible,
    error_from_response,
    parse_get,
    parse_health,
    parse_request_id,
    parse_request_statuses,
)
from npa_airflow.burst.client.api_requests import (
    ApiRequest,
    Identity,
    build_api_cancel,
    build_cluster_requests,
    build_get,
    build_health,
    build_request_status,
    headers,
)
from npa_airflow.common.remote_errors import http_status_transient
from npa_airflow.common.retry import Backoff, Budget, aretry
from npa_airflow.exceptions import NpaConnectionError

# 2 s, 4 s, 8 s (capped at 10 s), each stretched by up to half again so clients that failed together spread out.
SEND_BACKOFF = Backoff(base=2.0, cap=10.0, jitter=0.5)


def decode(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def resendable(request: ApiRequest, exc: BaseException) -> bool:
    """Whether sending ``request`` again after ``exc`` cannot run it twice."""
    if isinstance(exc, httpx.ConnectError):  # nothing reached the server
        return True
    if isinstance(exc, httpx.TransportError):  # it may have reached the server
        return request.idempotent
    # A transient HTTP status; only raised for idempotent requests (see AsyncSkyPilotClient.send).
    return isinstance(exc, SkyPilotApiError) and exc.status_code is not None


def unreachable(endpoint: str, exc: BaseException) -> NpaConnectionError:
    return NpaConnectionError(f"SkyPilot API server at {endpoint} unreachable: {type(exc).__name__}: {exc}")


class AsyncSkyPilotClient:
    """The client (triggers on the triggerer's loop; ``SkyPilotClient`` runs it for sync callers).

    :param transport: an httpx transport to use instead of the network (tests replay recorded answers).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | None = None,
        identity: Identity | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.identity = identity or Identity()
        self.retries = retries
        self._http = httpx.AsyncClient(
            base_url=self.endpoint, headers=headers(token), timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSkyPilotClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def send(self, request: ApiRequest, *, timeout: float | None = None) -> httpx.Response:
        """One answer to ``request``, resent while that is safe and the retry budget lasts."""

        async def attempt() -> httpx.Response:
            response = await self._http.request(
                request.method,
                request.path,
                params=request.params,
                json=request.body,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
            if request.idempotent and http_status_transient(response.status_code):
                raise SkyPilotApiError(
                    f"{request.path} answered {response.status_code}", status_code=response.status_code
                )
            return response

        try:
            return await aretry(
                attempt,
                transient=lambda exc: resendable(request, exc),
                backoff=SEND_BACKOFF,
                budget=Budget(attempts=self.retries + 1),
            )
        except (httpx.TransportError, SkyPilotApiError) as exc:
            raise unreachable(self.endpoint, exc) from exc

    async def health(self) -> ServerInfo:
        response = await self.send(build_health())
        return check_compatible(parse_health(response.status_code, decode(response)), self.endpoint)

    async def submit(self, request: ApiRequest) -> str:
        """Schedule ``request``; its request id."""
        response = await self.send(request)
        return parse_request_id(response.status_code, response.headers, decode(response), request.path)

    async def get(self, request_id: str, *, timeout: float | None = 600) -> RequestResult:
        """Wait (server side) for the request to finish and return it."""
        response = await self.send(build_get(request_id), timeout=timeout)
        return parse_get(response.status_code, decode(response), request_id)

    async def request_statuses(self, request_ids: Sequence[str]) -> dict[str, RequestResult]:
        response = await self.send(build_request_status(request_ids))
        return parse_request_statuses(response.status_code, decode(response))

    async def cluster_requests(self, cluster: str) -> dict[str, RequestResult]:
        """The requests the server still holds for ``cluster``, by id (finished ones too)."""
        response = await self.send(build_cluster_requests(cluster))
        return parse_request_statuses(response.status_code, decode(response))

    async def call(self, request: ApiRequest, *, timeout: float | None = 600) -> Any:
        """Schedule ``request``, wait for it and return its value (or raise its error)."""
        result = await self.get(await self.submit(request), timeout=timeout)
        result.raise_for_error()
        return result.return_value

    async def cancel_requests(self, request_ids: Sequence[str]) -> list[str]:
        cancelled = await self.call(build_api_cancel(self.identity, request_ids), timeout=60)
        return [str(r) for r in cancelled or []]

    async def stream_lines(self, request: ApiRequest, *, timeout: float | None = None) -> AsyncIterator[str]:
        """The lines of a streamed answer (``/api/stream``), as they arrive; never resent."""
        async with self._open_stream(request, timeout) as response:
            async for line in response.aiter_lines():
                yield line

    async def stream_text(self, request: ApiRequest, *, timeout: float | None = None) -> AsyncIterator[str]:
        """The text of a streamed answer (``/logs``) in the pieces it arrives in, line ends and partial lines
        as they are; never resent. ``timeout``: the longest silence before the read fails."""
        async with self._open_stream(request, timeout) as response:
            async for text in response.aiter_text():
                yield text

    @contextlib.asynccontextmanager
    async def _open_stream(self, request: ApiRequest, timeout: float | None) -> AsyncIterator[httpx.Response]:
        async with self._http.stream(
            request.method,
            request.path,
            params=request.params,
            json=request.body,
            timeout=httpx.Timeout(30.0, read=timeout),
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise error_from_response(response.status_code, decode(response), request.path)
            yield response
