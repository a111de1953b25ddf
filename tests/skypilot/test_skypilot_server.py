"""Against a real SkyPilot API server on loopback (dev/skypilot): protocol round trips and Airflow runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst.task import dag_yaml
from tests.skypilot.conftest import SKY_SCRIPT, _sky_env, run_dag_test

DAGS = Path(__file__).resolve().parent / "dags"


def test_health_and_version_check(skypilot_server):
    with sky.SkyPilotClient(skypilot_server) as client:
        info = client.health()
    assert info.api_version >= sky.MIN_SERVER_API_VERSION
    assert info.status == "healthy"


async def test_async_client_health_and_status_round_trip(skypilot_server):
    async with sky.AsyncSkyPilotClient(skypilot_server) as client:
        assert (await client.health()).version
        clusters = sky.parse_clusters(await client.call(sky.build_status(client.identity, ["npa-none"])))
    assert clusters == {}


def test_status_round_trip_lists_clusters(skypilot_server):
    with sky.SkyPilotClient(skypilot_server) as client:
        request_id = client.submit(sky.build_status(client.identity))
        result = client.get(request_id)
        statuses = client.request_statuses([request_id])
    assert result.status == "SUCCEEDED" and result.name == "sky.status"
    assert isinstance(sky.parse_clusters(result.return_value), dict)
    assert statuses[request_id].status == "SUCCEEDED"


def test_failed_request_error_is_readable(skypilot_server):
    with sky.SkyPilotClient(skypilot_server) as client, pytest.raises(sky.SkyPilotApiError) as info:
        client.call(sky.build_queue(client.identity, "npa-no-such-cluster"))
    assert info.value.error_type == "ClusterDoesNotExist"
    assert "Cluster 'npa-no-such-cluster' does not exist." in str(info.value)
    assert "\x1b" not in str(info.value)


def test_api_cancel_cancels_exactly_the_given_request(skypilot_server):
    task = {"name": "cancel-me", "num_nodes": 1, "resources": {"infra": "aws"}, "run": "echo hi"}
    with sky.SkyPilotClient(skypilot_server) as client:
        bystander = client.submit(sky.build_status(client.identity))
        request_id = client.submit(sky.build_launch(client.identity, dag_yaml(task), "npa-cancel-check"))
        cancelled = client.cancel_requests([request_id])
        result = client.get(request_id)
        bystander_result = client.get(bystander)
    # The launch either was still in flight (then it is CANCELLED and listed) or had already failed
    # (nothing to cancel); the other request is never touched.
    if request_id in cancelled:
        assert result.status == "CANCELLED"
    else:
        assert cancelled == [] and result.status == "FAILED"
    assert bystander_result.status == "SUCCEEDED"


def test_submit_yaml_with_unresolved_placeholder_fails_before_any_request(skypilot_server, airflow_home):
    out = run_dag_test(airflow_home, DAGS / "burst_server_checks.py", "npa_burst_yaml_unresolved")
    assert out["states"] == {"submit": "failed"}
    assert "unresolved placeholder(s) ${NPA_OUTPUT_URI}" in out["log"]
    with sky.SkyPilotClient(skypilot_server) as client:
        response = client.send(
            sky.ApiRequest("GET", "/api/status", params={"cluster_name": "npa-unresolved-check", "all_status": "true"})
        )
        requests = sky.parse_request_statuses(response.status_code, response.json())
    assert requests == {}


def test_launch_error_reaches_the_task_log_readably(skypilot_server, airflow_home):
    out = run_dag_test(airflow_home, DAGS / "burst_server_checks.py", "npa_burst_infra_not_enabled")
    assert out["states"] == {"train": "failed"}
    log = out["log"]
    assert "launch request" in log.lower()
    assert "launch of cluster npa-infra-not-enabled failed:" in log
    assert "\x1b[" not in log.split("launch of cluster npa-infra-not-enabled failed:")[1][:400]


def test_sensor_reads_a_handle_produced_elsewhere_and_reports_the_launch_failure(skypilot_server):
    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.sensors import BurstJobSensor

    task = {"name": "sensed", "num_nodes": 1, "resources": {"infra": "aws"}, "run": "echo hi"}
    with sky.SkyPilotClient(skypilot_server) as client:
        request_id = client.submit(sky.build_launch(client.identity, dag_yaml(task), "npa-sensor-check"))
        client.get(request_id)  # wait until it has failed
    handle = BurstJobHandle(
        conn_id="skypilot_default",
        endpoint=skypilot_server,
        cluster="npa-sensor-check",
        name="sensed",
        request_id=request_id,
    )
    sensor = BurstJobSensor(task_id="watch", handle=handle.to_json(), deferrable=False)
    with pytest.raises(sky.SkyPilotApiError, match=r"\(sky.launch\) failed: \w+"):
        sensor.poke(context={})


def server_processes(home: str) -> dict[int, str]:
    """{pid: command line} of what dev/skypilot's server started: the processes with HOME=``home``, and the ssh
    ControlMaster muxes in the server's directory (a mux writes its title over its environment)."""
    found = {}
    server_dir = str(Path(home).parent.resolve())
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ours = f"HOME={home}".encode() in (proc / "environ").read_bytes().split(b"\0")
            mux = title.startswith("ssh: ") and "[mux]" in title and os.readlink(proc / "cwd") == server_dir
            if ours or mux:
                found[int(proc.name)] = title
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def test_down_stops_every_process_up_started(skypilot_server):
    """multiprocessing's resource_tracker (which ignores SIGTERM) and ssh ControlMaster muxes outlive the server's
    process group; `down` must stop them too, or they pile up over a day of up/down cycles."""
    home = f"{_sky_env()['NPA_SKY_DIR']}/home"
    assert server_processes(home), "the running server has no processes with its HOME: the check sees nothing"
    subprocess.run([str(SKY_SCRIPT), "down"], check=True, timeout=120)
    try:
        assert server_processes(home) == {}
    finally:
        subprocess.run([str(SKY_SCRIPT), "up"], check=True, timeout=300)
