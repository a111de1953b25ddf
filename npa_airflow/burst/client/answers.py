"""What a SkyPilot API server answers, read (``parse_*``), and its errors: the health check, request ids and
payloads, launch, job and cluster results. Pure; a pickled part of an answer is never read."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npa_airflow.burst.client.log_text import strip_ansi
from npa_airflow.burst.client.protocol import (
    CLIENT_VERSION,
    LAUNCH_REQUEST_NAME,
    MIN_SERVER_API_VERSION,
    REQUEST_FINISHED,
    REQUEST_ID_HEADER,
)
from npa_airflow.exceptions import NpaConnectionError, NpaError, NpaParseError

_DAG_NAME_RE = re.compile(r"name: ([A-Za-z0-9][A-Za-z0-9._-]{0,127})\n")


class SkyPilotApiError(NpaError):
    """A SkyPilot API request failed. ``error_type`` is SkyPilot's exception class name."""

    def __init__(
        self,
        message: str,
        *,
        error_type: str | None = None,
        request_id: str | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.request_id = request_id
        self.status_code = status_code


class SkyPilotRequestCancelled(SkyPilotApiError):
    """The request was cancelled (``/api/cancel``) before it finished."""


@dataclass(frozen=True)
class ServerInfo:
    api_version: int
    version: str
    status: str
    commit: str | None = None


@dataclass(frozen=True)
class RequestResult:
    """One request as ``/api/get`` or ``/api/status`` reports it (never with the pickled parts)."""

    request_id: str
    name: str
    status: str
    return_value: Any = None
    error_type: str | None = None
    error_message: str | None = None
    status_msg: str | None = None
    cluster_name: str | None = None
    created_at: float | None = None
    dag_name: str | None = None  # a launch's DAG name, when a request listing shows its body

    @property
    def finished(self) -> bool:
        return self.status in REQUEST_FINISHED

    def raise_for_error(self) -> None:
        if self.status == "CANCELLED":
            raise SkyPilotRequestCancelled(
                f"SkyPilot request {self.request_id} ({self.name}) was cancelled",
                error_type="RequestCancelled",
                request_id=self.request_id,
            )
        if self.error_type or self.status == "FAILED":
            raise SkyPilotApiError(
                f"SkyPilot request {self.request_id} ({self.name}) failed: "
                f"{self.error_type or 'Error'}: {self.error_message or '(no message)'}",
                error_type=self.error_type,
                request_id=self.request_id,
            )


def parse_health(status_code: int, payload: Any) -> ServerInfo:
    if status_code != 200 or not isinstance(payload, dict):
        raise SkyPilotApiError(f"/api/health answered {status_code}: {_short(payload)}", status_code=status_code)
    try:
        info = ServerInfo(
            api_version=int(payload["api_version"]),
            version=str(payload["version"]),
            status=str(payload.get("status", "")),
            commit=payload.get("commit"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise NpaParseError(f"/api/health answer without api_version/version: {_short(payload)}") from exc
    return info


def check_compatible(info: ServerInfo, endpoint: str) -> ServerInfo:
    if info.status and info.status != "healthy":
        raise NpaConnectionError(f"SkyPilot API server at {endpoint} reports status {info.status!r}, not healthy")
    if info.api_version < MIN_SERVER_API_VERSION:
        raise NpaConnectionError(
            f"SkyPilot API server at {endpoint} runs {info.version} (API version {info.api_version}); "
            f"npa-airflow needs API version >= {MIN_SERVER_API_VERSION} (SkyPilot >= 0.11.x, tested with "
            f"{CLIENT_VERSION}). Upgrade the API server"
        )
    return info


def parse_request_id(status_code: int, response_headers: Mapping[str, str], payload: Any, path: str) -> str:
    """The id of a request just scheduled, or the error the server gave instead."""
    if status_code != 200:
        raise error_from_response(status_code, payload, path)
    request_id = response_headers.get(REQUEST_ID_HEADER) or response_headers.get(REQUEST_ID_HEADER.lower())
    if not request_id:
        raise NpaParseError(f"{path} answered 200 without a {REQUEST_ID_HEADER} header: {_short(payload)}")
    return request_id


def error_from_response(status_code: int, payload: Any, path: str) -> SkyPilotApiError:
    """A readable error from a non-200 answer: FastAPI's ``detail`` (string, validation list or request)."""
    detail = payload.get("detail") if isinstance(payload, dict) else payload
    if isinstance(detail, dict) and "request_id" in detail:
        result = parse_request_payload(detail)
        return SkyPilotApiError(
            f"SkyPilot request {result.request_id} ({result.name}) failed: "
            f"{result.error_type or 'Error'}: {result.error_message or '(no message)'}",
            error_type=result.error_type,
            request_id=result.request_id,
            status_code=status_code,
        )
    if isinstance(detail, list):  # request validation errors: [{"loc": [...], "msg": ...}, ...]
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []))
                parts.append(f"{loc}: {item.get('msg', item)}")
            else:
                parts.append(str(item))
        message = "; ".join(parts)
    else:
        message = strip_ansi(str(detail if detail is not None else payload))
    if status_code in (401, 403):
        message += " (check the token on the skypilot connection)"
    return SkyPilotApiError(f"{path} answered {status_code}: {message}", status_code=status_code)


def _json_field(raw: Any) -> Any:
    if raw is None or not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_request_payload(payload: Mapping[str, Any]) -> RequestResult:
    """A ``RequestPayload``; ``return_value``/``error`` are decoded as JSON, ``error.object`` is ignored."""
    try:
        request_id = str(payload["request_id"])
        name = str(payload.get("name", ""))
        status = str(payload["status"])
    except (KeyError, TypeError) as exc:
        raise NpaParseError(f"not a SkyPilot request payload: {_short(payload)}") from exc
    error = _json_field(payload.get("error"))
    error_type = error_message = None
    if isinstance(error, dict):
        error_type = str(error.get("type") or "Error")
        error_message = strip_ansi(str(error.get("message") or "")).strip()
    elif error not in (None, "", "null"):
        error_type, error_message = "Error", strip_ansi(str(error)).strip()
    status_msg = payload.get("status_msg")
    created_at = payload.get("created_at")
    return RequestResult(
        request_id=request_id,
        name=name,
        status=status,
        return_value=_json_field(payload.get("return_value")),
        error_type=error_type,
        error_message=error_message,
        status_msg=strip_ansi(status_msg).strip() if isinstance(status_msg, str) else None,
        cluster_name=payload.get("cluster_name"),
        created_at=float(created_at) if isinstance(created_at, (int, float)) else None,
        dag_name=launch_dag_name(payload.get("request_body")) if name == LAUNCH_REQUEST_NAME else None,
    )


def launch_dag_name(request_body: Any) -> str | None:
    """The DAG name of a launch from its body as a request listing shows it (JSON; ``/api/get`` sends a pickle,
    which is never read), taken from the first line of the task YAML (``dag_yaml`` writes ``name: <name>``)."""
    if not isinstance(request_body, str) or not request_body.startswith("{"):
        return None
    try:
        task = json.loads(request_body).get("task")
    except (ValueError, AttributeError):
        return None
    match = _DAG_NAME_RE.match(task) if isinstance(task, str) else None
    return match.group(1) if match else None


def parse_get(status_code: int, payload: Any, request_id: str) -> RequestResult:
    if status_code == 200 and isinstance(payload, dict):
        return parse_request_payload(payload)
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if status_code == 500 and isinstance(detail, dict):
        return parse_request_payload(detail)
    if status_code == 404:
        raise SkyPilotApiError(
            f"SkyPilot request {request_id} not found on the API server (it may have been cleaned up, or the "
            "server's state was reset)",
            error_type="RequestNotFound",
            request_id=request_id,
            status_code=404,
        )
    raise error_from_response(status_code, payload, "/api/get")


def parse_request_statuses(status_code: int, payload: Any) -> dict[str, RequestResult]:
    if status_code != 200:
        raise error_from_response(status_code, payload, "/api/status")
    if not isinstance(payload, list):
        raise NpaParseError(f"/api/status answer is not a list: {_short(payload)}")
    return {r.request_id: r for r in (parse_request_payload(item) for item in payload)}


def parse_launch_result(return_value: Any) -> int | None:
    """The job id from a launch result ``{"job_id": N, "handle": <pickle, ignored>}``."""
    if not isinstance(return_value, dict) or "job_id" not in return_value:
        raise NpaParseError(f"launch result without job_id: {_short(return_value)}")
    job_id = return_value["job_id"]
    return None if job_id is None else int(job_id)


def parse_job_status(return_value: Any, job_id: int) -> str | None:
    """The native state of ``job_id`` from a ``/job_status`` result ``{"<id>": "RUNNING" | null}``."""
    if not isinstance(return_value, dict):
        raise NpaParseError(f"job_status result is not a mapping: {_short(return_value)}")
    native = return_value.get(str(job_id))
    return None if native is None else str(native)


def parse_queue(return_value: Any) -> dict[int, str]:
    """``/queue`` result -> {job id: native state}."""
    if not isinstance(return_value, list):
        raise NpaParseError(f"queue result is not a list: {_short(return_value)}")
    jobs = {}
    for record in return_value:
        if isinstance(record, dict) and isinstance(record.get("job_id"), int) and record.get("status") is not None:
            jobs[record["job_id"]] = str(record["status"])
    return jobs


def parse_queue_record(return_value: Any, job_id: int) -> dict[str, Any] | None:
    """The ``/queue`` record of ``job_id`` (job_id, status, submitted_at, start_at, end_at, resources, ...)."""
    if not isinstance(return_value, list):
        raise NpaParseError(f"queue result is not a list: {_short(return_value)}")
    for record in return_value:
        if isinstance(record, dict) and record.get("job_id") == job_id:
            return record
    return None


def parse_clusters(return_value: Any) -> dict[str, dict[str, Any]]:
    """``/status`` result -> {cluster name: record} (status, nodes, ...); pickled fields are dropped."""
    if not isinstance(return_value, list):
        raise NpaParseError(f"status result is not a list: {_short(return_value)}")
    clusters = {}
    for record in return_value:
        if isinstance(record, dict) and "name" in record:
            clusters[str(record["name"])] = {
                k: v for k, v in record.items() if k not in ("handle", "storage_mounts_metadata", "credentials")
            }
    return clusters


def _short(value: Any, limit: int = 500) -> str:
    text = strip_ansi(value if isinstance(value, str) else repr(value))
    return text if len(text) <= limit else text[:limit] + "..."
