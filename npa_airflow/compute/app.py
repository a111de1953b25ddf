"""The Compute page's HTTP side: a FastAPI app the plugin mounts in the Airflow API server.

- ``GET {prefix}/`` the page (static HTML + script; the UI shows it in its "Compute" nav entry);
- ``GET {prefix}/jobs`` the rows the signed-in user may read, with filter choices, per-cluster totals and the
  GPU-hours per DAG run.

The user is resolved exactly as for Airflow's own API (JWT cookie or bearer token). A row shows only for a DAG the
user may read; ``can_cancel`` tells the page whether the user may edit its task instances. Cancel itself is the
page calling Airflow's own ``PATCH .../taskInstances/{task_id}`` with ``new_state=failed``, so Airflow checks
the permission and the job ends as when the task is marked failed anywhere else (on_kill / the listener).
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse

from npa_airflow.compute import rows as r
from npa_airflow.compute import sources
from npa_airflow.compute import usage as u
from npa_airflow.compute.mount import URL_PREFIX

PAGE = files("npa_airflow.compute").joinpath("page.html")


def create_app() -> FastAPI:
    app = FastAPI(title="npa_airflow compute view", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request) -> HTMLResponse:
        ui_base = request.scope.get("root_path", "").removesuffix(URL_PREFIX)
        html = PAGE.read_text().replace("__UI_BASE__", _js_string(ui_base))
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/jobs")
    def jobs(
        user: Annotated[Any, Depends(get_user)],
        cluster: Annotated[str | None, Query(max_length=256)] = None,
        state: Annotated[str | None, Query(max_length=32)] = None,
        dag_id: Annotated[str | None, Query(max_length=250)] = None,
    ) -> dict[str, Any]:
        readable, editable = _dag_permissions(user)
        snap = sources.snapshot()
        visible = [row for row in snap.rows if row.dag_id in readable]
        shown = r.filter_rows(visible, cluster=cluster, state=state, dag_id=dag_id)
        every_state = r.filter_rows(visible, cluster=cluster, dag_id=dag_id)  # what the totals count
        clusters = {row.cluster for row in visible}
        return {
            "rows": [{**row.to_json(), "can_cancel": row.dag_id in editable} for row in shown],
            "totals": r.cluster_totals(every_state),
            "run_totals": u.run_totals(every_state),
            "choices": {
                "cluster": sorted(clusters),
                "state": sorted({row.state for row in visible}),
                "dag_id": sorted({row.dag_id for row in visible}),
            },
            "errors": {name: msg for name, msg in snap.errors.items() if name in clusters},
            "fetched_at": {name: t for name, t in snap.fetched_at.items() if name in clusters},
        }

    return app


def _dag_permissions(user: Any) -> tuple[set[str], set[str]]:
    manager = get_auth_manager()
    return (
        manager.get_authorized_dag_ids(user=user, method="GET"),
        manager.get_authorized_dag_ids(user=user, method="PUT"),
    )


def _js_string(value: str) -> str:
    return json.dumps(value).replace("<", "\\u003c")
