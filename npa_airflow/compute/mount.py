"""Where the plugin mounts the Compute app, built on its first request (see :mod:`npa_airflow.compute.app`)."""

from __future__ import annotations

from typing import Any

URL_PREFIX = "/npa-compute"


class LazyApp:
    """An ASGI app that builds the FastAPI app on its first request: importing the plugin stays cheap for the
    scheduler, workers and triggerers, which load plugins too but never serve the page."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            # every Airflow process loads the plugin: FastAPI and the page's sources load on the first request
            from npa_airflow.compute.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)
