"""Where the plugin mounts the Compute app, built on its first request (see :mod:`npa_airflow.compute.app`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

URL_PREFIX = "/npa-compute"


class LazyApp:
    """An ASGI app that builds the FastAPI app (`build`) on its first request: importing the plugin stays cheap for
    the scheduler, workers and triggerers, which load plugins too but never serve the page."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            self._app = self._build()
        await self._app(scope, receive, send)
