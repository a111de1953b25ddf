"""The Compute page in a real browser on a real Airflow: a running and a pending Slurm job of two DAGs, their
states and pending reason, the GPUs each cluster holds and waits for, and Cancel on one job.

Debian's chromium driven by Playwright, as in test_browser.py. The screenshot is saved under the test's tmp dir;
with NPA_E2E_SCREENSHOT=1 it also replaces docs/img/compute-view.png (docs/ui.md's picture).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.e2e.airflow_api import AirflowApi, poll
from tests.e2e.test_browser import log_in, page  # noqa: F401 (fixture)

RUNNING_DAG = "npa_e2e_compute_running"
PENDING_DAG = "npa_e2e_compute_pending"
TASK_ID = "train"
DOC_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "compute-view.png"


def start(api: AirflowApi, dag_id: str) -> tuple[str, str]:
    """Trigger a run and wait until its task waits on its job (DEFERRED, handle in XCom): (run id, job id)."""
    api.wait_for_dag(dag_id)
    run_id = api.trigger(dag_id)
    api.wait_for_state(dag_id, run_id, TASK_ID, {"deferred"}, timeout=120)
    handle = poll(lambda: api.xcom(dag_id, run_id, TASK_ID, "slurm_job"), 30, f"the job handle of {dag_id}")
    return run_id, str(handle["job_id"])


def jobs(api: AirflowApi, **filters: str) -> dict:
    return api.get("/npa-compute/jobs", params=filters)


def jobs_showing(api: AirflowApi, *job_ids: str, reason: tuple[str, str] | None = None) -> dict:
    """The page's data once it lists every one of `job_ids` (and the job `reason[0]` waits for `reason[1]`:
    the page's answer may be up to one cache lifetime older than Slurm's)."""

    def probe() -> dict | None:
        data = jobs(api)
        rows = {row["job"]: row for row in data["rows"]}
        if not set(job_ids) <= set(rows) or (reason and rows[reason[0]]["reason"] != reason[1]):
            return None
        return data

    return poll(probe, 60, f"jobs {job_ids} on the Compute page (pending reason {reason})")


@pytest.fixture
def two_jobs(api, wait_sacct):
    """A job running on one GPU node, then one pending for both GPU nodes; both ended afterwards."""
    started: list[tuple[str, str, str]] = []
    try:
        run_a, job_a = start(api, RUNNING_DAG)
        started.append((RUNNING_DAG, run_a, job_a))
        wait_sacct(job_a, ("RUNNING",), timeout=60)
        run_b, job_b = start(api, PENDING_DAG)
        started.append((PENDING_DAG, run_b, job_b))
        wait_sacct(job_b, ("PENDING",), timeout=60)
        yield started
    finally:
        for dag_id, run_id, job_id in started:
            if api.task_instance(dag_id, run_id, TASK_ID)["state"] == "deferred":
                api.set_state(dag_id, run_id, TASK_ID, "failed")
            wait_sacct(job_id, ("CANCELLED", "COMPLETED", "FAILED"), timeout=60)


def test_the_page_shows_running_and_pending_jobs_and_cancels_one(
    api,
    airflow,
    page,  # noqa: F811 (the fixture imported above)
    two_jobs,
    wait_sacct,
    cluster_ssh,
    tmp_path,
):
    (_, run_a, job_a), (_, run_b, job_b) = two_jobs
    reason = cluster_ssh(f"squeue -h -o %r -j {int(job_b)}", check=True).stdout.strip()  # Slurm's own reason
    assert reason in ("Resources", "Priority"), f"job {job_b} pends for {reason!r}, not for the GPUs job {job_a} holds"

    # The JSON the page reads: both jobs with Slurm's states and reason, and the GPUs per cluster.
    data = jobs_showing(api, job_a, job_b, reason=(job_b, reason))
    by_job = {r["job"]: r for r in data["rows"]}
    assert (by_job[job_a]["state"], by_job[job_a]["nodes"], by_job[job_a]["gpus"]) == ("RUNNING", 1, 8)
    assert (by_job[job_b]["state"], by_job[job_b]["reason"], by_job[job_b]["gpus"]) == ("PENDING", reason, 16)
    assert by_job[job_a]["partition"] == "gpu" and by_job[job_a]["can_cancel"] is True
    (totals,) = [t for t in data["totals"] if t["cluster"] == by_job[job_a]["cluster"]]
    assert totals["gpus_held"] >= 8 and totals["gpus_pending"] >= 16
    assert [r["job"] for r in jobs(api, dag_id=PENDING_DAG, state="pending")["rows"]] == [job_b]

    # The page, inside the Airflow UI: the nav entry opens it; both rows with state and reason.
    log_in(page, api)
    page.goto(f"{api.base_url}/plugin/compute")
    frame = page.frame_locator("iframe")
    row_a = frame.locator(f"tr.job[data-job='{job_a}']")
    row_b = frame.locator(f"tr.job[data-job='{job_b}']")
    row_a.locator("td.state").get_by_text("RUNNING").wait_for()
    row_b.locator("td.state").get_by_text("PENDING").wait_for()
    row_b.get_by_text(reason, exact=True).wait_for()
    row_a.get_by_role("link", name="log").wait_for()
    shot = tmp_path / "compute-view.png"
    page.screenshot(path=str(shot))
    print(f"\n[e2e] screenshot: {shot}")
    if os.environ.get("NPA_E2E_SCREENSHOT") == "1":
        DOC_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOC_SCREENSHOT)

    # Cancel the pending job: its task is marked failed through Airflow's API, the job ends CANCELLED,
    # the running one runs on.
    row_b.get_by_role("button", name="Cancel").click()
    row_b.get_by_role("button", name="Confirm cancel").click()
    api.wait_for_state(PENDING_DAG, run_b, TASK_ID, {"failed"}, timeout=30)
    wait_sacct(job_b, ("CANCELLED",), timeout=60)
    assert api.task_instance(RUNNING_DAG, run_a, TASK_ID)["state"] == "deferred"
    wait_sacct(job_a, ("RUNNING",), timeout=5)
    frame.locator(f"tr.job[data-job='{job_b}']").wait_for(state="detached", timeout=60_000)
    row_a.locator("td.state").get_by_text("RUNNING").wait_for()


def test_a_viewer_sees_the_jobs_but_may_not_cancel_them(api, airflow, two_jobs, wait_sacct):
    """The page hides nothing it may show, and Airflow itself refuses the cancel of a user who cannot edit."""
    (_, run_a, job_a), _ = two_jobs
    passwords = json.loads((airflow.home / "passwords.json").read_text())
    viewer = AirflowApi(api.base_url, "viewer", passwords["viewer"])
    try:
        data = jobs_showing(viewer, job_a)
        assert {r["job"]: r["can_cancel"] for r in data["rows"]}[job_a] is False
        path = f"/api/v2/dags/{RUNNING_DAG}/dagRuns/{quote(run_a, safe='')}/taskInstances/{TASK_ID}"
        refused = viewer.request("PATCH", path, json={"new_state": "failed"}, expect=(403,))
        assert refused.status_code == 403
    finally:
        viewer.close()
    assert api.task_instance(RUNNING_DAG, run_a, TASK_ID)["state"] == "deferred"
    wait_sacct(job_a, ("RUNNING",), timeout=5)
