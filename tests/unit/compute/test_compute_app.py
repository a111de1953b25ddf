"""The Compute app's HTTP side: rows only of readable DAGs, Cancel offered only where the user may edit, filters."""

from __future__ import annotations

import pytest

from npa_airflow.compute import app as compute_app
from npa_airflow.compute import rows as r
from npa_airflow.compute import sources


def _row(job: str, dag: str, state: str, cluster: str = "main", hours: float | None = None) -> r.ComputeRow:
    handle = {"conn_id": "slurm_default", "cluster": cluster, "job_id": job, "job_name": f"npa-{dag}-s2-t1"}
    earlier = {"npa_usage": {"gpu_hours": 0.5}}  # what segment 1 used, reported when it ended
    script = {"sbatch_script": "#SBATCH -N 1"}
    task = r.LiveTask(dag, "run", "t", -1, 1, "deferred", {"slurm_job": handle}, script, None, earlier)
    usage = None if hours is None else {"gpu_hours": hours}
    status = r.JobStatus(state, state, "Resources" if state == "PENDING" else None, None, usage)
    return r.slurm_row(task, status, {}, now=0.0)


@pytest.fixture
def client(monkeypatch):
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient

    rows = [_row("1", "mine", "RUNNING", hours=1.5), _row("2", "mine", "PENDING", hours=0.0)]
    rows += [_row("3", "readonly", "RUNNING", "c2"), _row("4", "secret", "RUNNING", hours=9.0)]
    snap = sources.Snapshot(rows, errors={"c2": "NpaRemoteError: no answer", "c9": "x"}, fetched_at={"main": 1.0})
    monkeypatch.setattr(sources, "snapshot", lambda: snap)
    monkeypatch.setattr(compute_app, "_dag_permissions", lambda user: ({"mine", "readonly"}, {"mine"}))
    app = compute_app.create_app()
    app.dependency_overrides[get_user] = lambda: object()
    with TestClient(app, root_path="/base/npa-compute") as test_client:
        yield test_client


def test_rows_of_unreadable_dags_are_not_shown_and_cancel_follows_edit_rights(client):
    data = client.get("/jobs").json()
    assert {row["job"]: row["can_cancel"] for row in data["rows"]} == {"1": True, "2": True, "3": False}
    assert data["choices"] == {
        "cluster": ["c2", "main"],
        "state": ["PENDING", "RUNNING"],
        "dag_id": ["mine", "readonly"],
    }
    assert data["errors"] == {"c2": "NpaRemoteError: no answer"}  # only clusters of rows the user may see


def test_filters_narrow_the_rows_and_totals(client):
    data = client.get("/jobs", params={"cluster": "main", "state": "pending"}).json()
    assert [row["job"] for row in data["rows"]] == ["2"]
    assert [t["cluster"] for t in data["totals"]] == ["main"]
    assert client.get("/jobs", params={"state": "x" * 33}).status_code == 422


def test_rows_carry_gpu_hours_and_segment_and_each_run_its_total(client):
    data = client.get("/jobs").json()
    by_job = {row["job"]: row for row in data["rows"]}
    # segment 2's own 1.5 so far, and segment 1's 0.5
    assert (by_job["1"]["gpu_hours"], by_job["1"]["gpu_hours_from"], by_job["1"]["segment"]) == (2.0, "cluster", 2)
    assert by_job["3"]["gpu_hours"] is None and by_job["3"]["gpu_hours_unknown"]
    assert data["run_totals"] == [  # only the runs of readable DAGs: "secret" is not summed anywhere
        {"dag_id": "mine", "run_id": "run", "jobs": 2, "gpu_hours": 2.5, "unknown": 0},
        {"dag_id": "readonly", "run_id": "run", "jobs": 1, "gpu_hours": None, "unknown": 1},
    ]
    # like the cluster totals, a run's total counts its jobs of every state, within the cluster and DAG filters
    narrowed = client.get("/jobs", params={"state": "pending", "dag_id": "mine"}).json()["run_totals"]
    assert [(t["dag_id"], t["jobs"], t["gpu_hours"]) for t in narrowed] == [("mine", 2, 2.5)]


def test_the_page_renders_gpu_hours_segments_and_run_totals(client):
    html = client.get("/").text
    assert "<th>GPU-hours</th>" in html and 'id="runs"' in html and "data.run_totals" in html
    assert "segment ${row.segment}" in html and "row.gpu_hours_unknown" in html and "+ unknown" in html


def test_the_page_knows_the_ui_base_path(client):
    html = client.get("/").text
    assert 'const UI_BASE = "/base";' in html and "__UI_BASE__" not in html


def test_the_plugin_mounts_the_page_where_its_nav_entry_points():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from npa_airflow.plugin import NpaAirflowPlugin

    (mounted,) = NpaAirflowPlugin.fastapi_apps
    (view,) = NpaAirflowPlugin.external_views
    root = FastAPI()
    root.mount(mounted["url_prefix"], mounted["app"])
    with TestClient(root) as test_client:
        page = test_client.get(view["href"])
    assert page.status_code == 200 and 'const UI_BASE = "";' in page.text
    assert view["url_route"] == "compute" and view["name"] == "Compute"
