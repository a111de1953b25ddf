"""A Burst task in the real Airflow: live log and extra link while waiting; mark failed cancels it on SkyPilot.

Runs a 2-node torchrun job through the local SkyPilot API server on its Slurm infra (the local cluster):
`tests/e2e/dags/npa_e2e_burst.py`. Slow (a SkyPilot launch), and needs the SkyPilot server.
"""

from __future__ import annotations

import re

import pytest

from npa_airflow.burst import client as sky
from tests.e2e.airflow_api import poll
from tests.skypilot.conftest import skypilot_server, skypilot_slurm, wait_no_slurm_jobs  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.skypilot, pytest.mark.slow]

DAG_ID = "npa_e2e_burst"
TASK_ID = "burst"
CLUSTER = "npa-e2e-burst-ui"
TICK = re.compile(r"tick (\d+) of 600")


def cluster_names(endpoint: str) -> set[str]:
    with sky.SkyPilotClient(endpoint) as client:
        return set(sky.parse_clusters(client.call(sky.build_status(client.identity))))


@pytest.fixture
def no_leftover_cluster(skypilot_server):  # noqa: F811
    """Whatever the test's outcome, do not leave the 2-node cluster holding the partition."""
    yield
    if CLUSTER in cluster_names(skypilot_server):
        with sky.SkyPilotClient(skypilot_server) as client:
            client.call(sky.build_down(client.identity, CLUSTER), timeout=300)


def test_burst_live_log_link_and_mark_failed_cancels(api, skypilot_server, skypilot_slurm, no_leftover_cluster):  # noqa: F811
    api.wait_for_dag(DAG_ID)
    run_id = api.trigger(DAG_ID)
    ti = api.wait_for_state(DAG_ID, run_id, TASK_ID, {"deferred"}, timeout=900)
    handle = poll(lambda: api.xcom(DAG_ID, run_id, TASK_ID, "burst_job"), 60, "the burst handle in XCom")
    assert handle["cluster"] == CLUSTER

    link = api.extra_links(DAG_ID, run_id, TASK_ID).get("SkyPilot cluster")
    assert link, "no 'SkyPilot cluster' extra link while the task waits"

    def ticks_in_log():
        lines = api.log_lines_while_unfinished(DAG_ID, run_id, TASK_ID, ti["try_number"])
        found = [int(m.group(1)) for line in lines if (m := TICK.search(line))]
        return found if len(found) >= 3 else None

    found = poll(ticks_in_log, 900, "the job's ticks in the task log", interval=2)
    assert found == list(range(1, len(found) + 1)), found
    assert api.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "deferred"

    api.set_state(DAG_ID, run_id, TASK_ID, "failed")
    poll(lambda: CLUSTER not in cluster_names(skypilot_server), 180, f"cluster {CLUSTER} cancelled and torn down", 5)
    assert wait_no_slurm_jobs(CLUSTER) == []
