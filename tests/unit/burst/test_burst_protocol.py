"""The SkyPilot HTTP protocol (burst/client/: protocol.py, api_requests.py, answers.py, log_text.py): request
building, and parsing of answers recorded from a real 0.14.1 server.

The samples under samples/ were recorded by tests/skypilot/record_samples.py against `dev/skypilot up`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaConnectionError, NpaParseError, NpaValidationError

SAMPLES = Path(__file__).resolve().parent / "samples"


def sample(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.json").read_text())


IDENT = sky.Identity(user="airflow", config_overrides={"slurm": {"x": 1}})


def test_every_request_carries_identity_and_config_override():
    req = sky.build_launch(IDENT, "name: t\n---\nrun: x\n", "npa-c1", retry_until_up=True)
    assert (req.method, req.path, req.idempotent) == ("POST", "/launch", False)
    assert req.body["cluster_name"] == "npa-c1"
    assert req.body["retry_until_up"] is True
    assert req.body["env_vars"] == {"SKYPILOT_USER_ID": sky.user_hash("airflow"), "SKYPILOT_USER": "airflow"}
    assert req.body["override_skypilot_config"] == {"slurm": {"x": 1}}
    assert len(sky.user_hash("airflow")) == 8


def test_status_never_asks_for_credentials_or_handles():
    body = sky.build_status(IDENT, ["a"]).body
    assert body["include_credentials"] is False
    assert body["include_handle"] is False
    assert body["cluster_names"] == ["a"]


def test_api_cancel_refuses_an_empty_or_null_id_list():
    for ids in ([], None):
        with pytest.raises(NpaValidationError, match="cancels every request of the user"):
            sky.build_api_cancel(IDENT, ids)
    req = sky.build_api_cancel(IDENT, ["7cb6e6b7-25da-4c35-a962-beb9137e2d76"])
    assert req.body["request_ids"] == ["7cb6e6b7-25da-4c35-a962-beb9137e2d76"]


@pytest.mark.parametrize("bad", ["", "a b", "../../etc", "x" * 100, None])
def test_request_ids_are_validated(bad):
    with pytest.raises(NpaValidationError, match="not a SkyPilot request id"):
        sky.build_get(bad)


def test_headers_carry_api_version_and_optional_bearer_token():
    assert sky.headers(None) == {"X-SkyPilot-API-Version": "62", "X-SkyPilot-Version": "0.14.1"}
    assert sky.headers("tok")["Authorization"] == "Bearer tok"


def test_health_sample_is_compatible():
    rec = sample("health")
    info = sky.check_compatible(sky.parse_health(rec["status_code"], rec["body"]), "http://x")
    assert (info.api_version, info.version, info.status) == (62, "0.14.1", "healthy")


def test_old_server_is_refused_with_what_to_do():
    info = sky.ServerInfo(api_version=40, version="0.10.0", status="healthy")
    with pytest.raises(NpaConnectionError, match=r"runs 0.10.0 \(API version 40\).*Upgrade the API server"):
        sky.check_compatible(info, "http://x")


def test_request_id_comes_from_the_header():
    rec = sample("status_submit")
    rid = sky.parse_request_id(rec["status_code"], rec["headers"], rec["body"], "/status")
    assert rid == rec["headers"]["x-skypilot-request-id"]


def test_successful_get_decodes_the_json_return_value():
    result = sky.parse_get(200, sample("status_get")["body"], "x")
    assert (result.name, result.status, result.return_value, result.error_type) == ("sky.status", "SUCCEEDED", [], None)
    result.raise_for_error()
    assert sky.parse_clusters(result.return_value) == {}


def test_failed_request_error_is_readable_without_unpickling():
    rec = sample("queue_missing_cluster_get")
    assert rec["status_code"] == 500
    result = sky.parse_get(rec["status_code"], rec["body"], "x")
    assert result.status == "FAILED"
    assert result.error_type == "ClusterDoesNotExist"
    assert result.error_message == "Cluster 'npa-no-such-cluster' does not exist."  # ANSI colour codes stripped
    assert "\x1b" in json.loads(rec["body"]["detail"]["error"])["message"]
    with pytest.raises(sky.SkyPilotApiError, match="failed: ClusterDoesNotExist: Cluster 'npa-no-such") as info:
        result.raise_for_error()
    assert info.value.error_type == "ClusterDoesNotExist"


def test_launch_failure_names_the_cause():
    result = sky.parse_get(500, sample("launch_no_cloud_get")["body"], "x")
    assert (result.name, result.error_type) == ("sky.launch", "NoCloudAccessError")
    assert "Cloud access is not set up" in result.error_message


def test_validation_error_lists_the_field():
    rec = sample("launch_invalid_body")
    with pytest.raises(sky.SkyPilotApiError, match=r"/launch answered 422: body.cluster_name: Field required"):
        sky.parse_request_id(rec["status_code"], rec["headers"], rec["body"], "/launch")


def test_unknown_request_is_a_clear_404():
    rec = sample("get_unknown")
    with pytest.raises(sky.SkyPilotApiError, match="not found on the API server") as info:
        sky.parse_get(rec["status_code"], rec["body"], "00000000-0000-0000-0000-000000000000")
    assert info.value.status_code == 404


def test_api_status_is_read_without_waiting():
    rec = sample("api_status")
    statuses = sky.parse_request_statuses(rec["status_code"], rec["body"])
    (result,) = statuses.values()
    assert result.status == "SUCCEEDED" and result.name == "sky.status"


def test_api_cancel_result_lists_cancelled_ids():
    assert sky.parse_get(200, sample("api_cancel_get")["body"], "x").return_value == []


def test_cancelled_request_raises_its_own_type():
    result = sky.RequestResult(request_id="r", name="sky.launch", status="CANCELLED")
    with pytest.raises(sky.SkyPilotRequestCancelled):
        result.raise_for_error()


def test_launch_and_job_status_results():
    assert sky.parse_launch_result({"job_id": 3, "handle": "gASV..."}) == 3
    assert sky.parse_launch_result({"job_id": None, "handle": None}) is None
    with pytest.raises(NpaParseError):
        sky.parse_launch_result("gASV")
    assert sky.parse_job_status({"3": "RUNNING"}, 3) == "RUNNING"
    assert sky.parse_job_status({"3": None}, 3) is None


@pytest.mark.parametrize(
    "native, state",
    [
        ("INIT", JobState.PENDING),
        ("PENDING", JobState.PENDING),
        ("SETTING_UP", JobState.RUNNING),
        ("RUNNING", JobState.RUNNING),
        ("SUCCEEDED", JobState.COMPLETE),
        ("FAILED", JobState.ERROR),
        ("FAILED_SETUP", JobState.ERROR),
        ("FAILED_DRIVER", JobState.ERROR),
        ("CANCELLED", JobState.CANCELED),
        ("SOMETHING_NEW", JobState.UNKNOWN),
        (None, JobState.UNKNOWN),
    ],
)
def test_job_states_map_to_the_shared_vocabulary(native, state):
    assert sky.interpret_job_state(native) is state


@pytest.mark.parametrize(
    "line, shown",
    [
        ("\x1b[32mI 12-02 13:11:05 train.py] step 1\x1b[0m\n", "I 12-02 13:11:05 train.py] step 1"),
        ("<rich_update>Launching</rich_update>\n", None),
        ("<heartbeat>x</heartbeat>", None),
        ('<sky-payload>{"a": 1}</sky-payload>\n', None),
        ("progress 10%\r", "progress 10%"),
        ("   \n", None),
        ("(head, rank=0) loss=0.1\n", "(head, rank=0) loss=0.1"),
    ],
)
def test_log_lines_lose_ansi_and_control_codes(line, shown):
    assert sky.clean_log_line(line) == shown


def test_recorded_job_and_launch_logs_are_cleaned():
    rec = sample("log_lines")
    job = [line for line in map(sky.clean_log_line, rec["job_log"]) if line is not None]
    assert job == [
        "Waiting for task resources on 2 nodes.",
        "(head, rank=0, pid=25447) rank=0 nodes=2 gpus=0 ips=127.0.0.1 127.0.0.1, host=vm",
        "(head, rank=1, pid=25478) rank=1 nodes=2 gpus=0 ips=127.0.0.1 127.0.0.1, host=vm",
        "✓ Job finished (status: SUCCEEDED).",
    ]
    launch = [line for line in map(sky.clean_log_line, rec["launch_log"]) if line is not None]
    assert all("\x1b" not in line and "<sky-payload" not in line and "heartbeat" not in line for line in launch)
    assert "Job submitted, ID: 1" in "\n".join(launch)


def test_a_launch_in_a_request_listing_shows_its_dag_name_and_creation_time():
    from npa_airflow.burst.task import dag_yaml

    body = json.dumps(
        {"cluster_name": "npa-c1", "task": dag_yaml({"name": "train", "run": "x"}, "npa-d-0123456789-t2")}
    )
    payload = {"request_id": "63e57704-ba0f-4b9a", "name": "sky.launch", "status": "RUNNING", "created_at": 17.5}
    listed = sky.parse_request_payload({**payload, "request_body": body, "cluster_name": "npa-c1"})
    assert (listed.dag_name, listed.created_at, listed.cluster_name) == ("npa-d-0123456789-t2", 17.5, "npa-c1")
    # /api/get sends the body pickled (never read) and other users' listings send null: no name then.
    assert sky.parse_request_payload({**payload, "request_body": "gASVawIAAAAAAACMHHNreS5zZX"}).dag_name is None
    assert sky.parse_request_payload({**payload, "request_body": "null"}).dag_name is None


def test_cluster_request_listing_and_queue():
    req = sky.build_cluster_requests("npa-c1")
    assert (req.method, req.path, dict(req.params)) == (
        "GET",
        "/api/status",
        {"cluster_name": "npa-c1", "all_status": "true"},
    )
    queue = sky.build_queue(IDENT, "npa-c1")
    assert (queue.path, queue.body["cluster_name"], queue.body["all_users"]) == ("/queue", "npa-c1", True)
    assert sky.parse_queue([{"job_id": 1, "status": "FAILED"}, {"job_id": 2, "status": "RUNNING"}]) == {
        1: "FAILED",
        2: "RUNNING",
    }
    with pytest.raises(NpaParseError):
        sky.parse_queue({"job_id": 1})
