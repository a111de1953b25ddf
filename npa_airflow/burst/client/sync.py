"""``SkyPilotClient``: the blocking face of ``AsyncSkyPilotClient`` for operators, sensors and the plugin.

Like ``SlurmHook``'s sync methods, each call runs the async client's coroutine on a private event-loop thread,
so the protocol and its retry policy exist once, and the client's connections live on one loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from npa_airflow.burst.client.answers import RequestResult, ServerInfo
from npa_airflow.burst.client.api_requests import ApiRequest, Identity
from npa_airflow.burst.client.transport import AsyncSkyPilotClient
from npa_airflow.common.background_loop import run_sync

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")


class SkyPilotClient:
    """Blocking client: the same constructor and methods as ``AsyncSkyPilotClient``, without ``await``."""

    def __init__(self, endpoint: str, **options: Any) -> None:
        """``options`` are :class:`AsyncSkyPilotClient`'s (token, identity, timeout, retries, transport)."""
        self.core = AsyncSkyPilotClient(endpoint, **options)

    @property
    def endpoint(self) -> str:
        return self.core.endpoint

    @property
    def identity(self) -> Identity:
        return self.core.identity

    def close(self) -> None:
        run_sync(self.core.aclose())

    def __enter__(self) -> SkyPilotClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: ApiRequest, *, timeout: float | None = None) -> httpx.Response:
        return run_sync(self.core.send(request, timeout=timeout))

    def health(self) -> ServerInfo:
        return run_sync(self.core.health())

    def submit(self, request: ApiRequest) -> str:
        return run_sync(self.core.submit(request))

    def get(self, request_id: str, *, timeout: float | None = 600) -> RequestResult:
        return run_sync(self.core.get(request_id, timeout=timeout))

    def request_statuses(self, request_ids: Sequence[str]) -> dict[str, RequestResult]:
        return run_sync(self.core.request_statuses(request_ids))

    def cluster_requests(self, cluster: str) -> dict[str, RequestResult]:
        return run_sync(self.core.cluster_requests(cluster))

    def call(self, request: ApiRequest, *, timeout: float | None = 600) -> Any:
        return run_sync(self.core.call(request, timeout=timeout))

    def cancel_requests(self, request_ids: Sequence[str]) -> list[str]:
        return run_sync(self.core.cancel_requests(request_ids))
