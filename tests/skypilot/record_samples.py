"""Record request/response samples from a real SkyPilot API server into tests/unit/burst/samples/.

    dev/skypilot up && .venv/bin/python -m tests.skypilot.record_samples

The unit tests parse these files; re-record them when the server version changes. Pickled fields in
the answers (entrypoint, request_body, error.object, handle) are kept verbatim: the client must ignore them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from npa_airflow.burst.client import (
    ApiRequest,
    SkyPilotClient,
    build_api_cancel,
    build_get,
    build_health,
    build_launch,
    build_queue,
    build_request_status,
    build_status,
)
from npa_airflow.burst.task import dag_yaml

SAMPLES = Path(__file__).resolve().parent.parent / "unit" / "burst" / "samples"
KEEP_HEADERS = ("x-skypilot-request-id", "x-skypilot-api-version", "x-skypilot-version", "content-type")


def save(name: str, response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    record = {
        "request": {"method": response.request.method, "path": response.request.url.path},
        "status_code": response.status_code,
        "headers": {k: v for k, v in response.headers.items() if k.lower() in KEEP_HEADERS},
        "body": body,
    }
    (SAMPLES / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"{name}: {response.status_code}", file=sys.stderr)
    return record


def request_id(record: dict) -> str:
    return record["headers"]["x-skypilot-request-id"]


def main() -> None:
    endpoint = os.environ.get("NPA_SKY_ENDPOINT", "http://127.0.0.1:26580")
    SAMPLES.mkdir(parents=True, exist_ok=True)
    with SkyPilotClient(endpoint) as client:
        ident = client.identity
        save("health", client.send(build_health()))
        status = save("status_submit", client.send(build_status(ident)))
        save("status_get", client.send(build_get(request_id(status))))
        save("api_status", client.send(build_request_status([request_id(status)])))
        queue = save("queue_missing_cluster_submit", client.send(build_queue(ident, "npa-no-such-cluster")))
        save("queue_missing_cluster_get", client.send(build_get(request_id(queue))))
        task = {"name": "t", "num_nodes": 1, "resources": {"cpus": "1+"}, "run": "echo hi"}
        launch = save("launch_no_cloud_submit", client.send(build_launch(ident, dag_yaml(task), "npa-sample")))
        save("launch_no_cloud_get", client.send(build_get(request_id(launch))))
        save("launch_invalid_body", client.send(ApiRequest("POST", "/launch", body={"task": "name: x\n"})))
        save("get_unknown", client.send(build_get("00000000-0000-0000-0000-000000000000")))
        cancel = save("api_cancel_submit", client.send(build_api_cancel(ident, [request_id(launch)])))
        time.sleep(0.2)
        save("api_cancel_get", client.send(build_get(request_id(cancel))))


if __name__ == "__main__":
    main()
