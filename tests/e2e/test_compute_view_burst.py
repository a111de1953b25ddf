"""The Compute page with a Burst job: the SkyPilot cluster and job with SkyPilot's state, and Cancel from the page.

Runs tests/e2e/dags/npa_e2e_burst.py (a 2-node torchrun job through the local SkyPilot API server on its Slurm
infra). Slow (a SkyPilot launch), and needs the SkyPilot server.
"""

from __future__ import annotations

import pytest

from tests.e2e.airflow_api import poll
from tests.e2e.test_browser import log_in, page  # noqa: F401 (fixture)
from tests.e2e.test_burst_ui import CLUSTER, DAG_ID, TASK_ID, cluster_names, no_leftover_cluster  # noqa: F401
from tests.skypilot.conftest import skypilot_server, skypilot_slurm  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.skypilot,
    pytest.mark.slow,
]


def test_a_burst_job_shows_and_is_cancelled_from_the_page(
    api,
    page,  # noqa: F811
    skypilot_server,  # noqa: F811
    skypilot_slurm,  # noqa: F811
    no_leftover_cluster,  # noqa: F811
):
    api.wait_for_dag(DAG_ID)
    run_id = api.trigger(DAG_ID)
    api.wait_for_state(DAG_ID, run_id, TASK_ID, {"deferred"}, timeout=900)

    def launched() -> dict | None:
        handle = api.xcom(DAG_ID, run_id, TASK_ID, "burst_job")
        return handle if handle and handle.get("job_id") is not None else None

    handle = poll(launched, 900, "the burst job id in XCom", interval=2)
    job = f"{CLUSTER}/{handle['job_id']}"

    def running_row() -> dict | None:
        rows = [r for r in api.get("/npa-compute/jobs")["rows"] if r["kind"] == "burst" and r["job"] == job]
        return rows[0] if rows and rows[0]["state"] == "RUNNING" else None

    row = poll(running_row, 300, f"burst job {job} RUNNING on the Compute page", interval=2)
    assert (row["cluster"], row["dag_id"], row["can_cancel"]) == (CLUSTER, DAG_ID, True)
    assert row["job_url"], "no SkyPilot dashboard link"

    log_in(page, api)
    page.goto(f"{api.base_url}/plugin/compute")
    burst_row = page.frame_locator("iframe").locator(f"tr.job[data-job='{job}']")
    burst_row.locator("td.state").get_by_text("RUNNING").wait_for()
    burst_row.get_by_role("button", name="Cancel").click()
    burst_row.get_by_role("button", name="Confirm cancel").click()

    api.wait_for_state(DAG_ID, run_id, TASK_ID, {"failed"}, timeout=60)
    poll(lambda: CLUSTER not in cluster_names(skypilot_server), 180, f"cluster {CLUSTER} cancelled and torn down", 5)
