"""The SkyPilot API protocol, pure: request builders (``build_*``) and answer parsers (``parse_*``).

No I/O, no ``import sky``, nothing ever unpickled; ``transport.AsyncSkyPilotClient`` moves the bytes.

Protocol (SkyPilot 0.14 API server, API version 62): a ``POST /<operation>`` schedules a request and
answers with its id in the ``X-Skypilot-Request-ID`` header; ``GET /api/get?request_id=`` waits for it
and returns its payload (``return_value`` and ``error`` are JSON strings; ``error.object`` is a pickle we
never touch); ``GET /api/status`` reads request states without waiting; ``POST /api/cancel`` cancels
request ids (never sent without ids: a null list cancels every request of the user); ``POST /logs``
streams a job's log as text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from npa_airflow.burst.handle import REQUEST_ID_RE
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaConnectionError, NpaError, NpaParseError, NpaValidationError

# The API version whose request/response shapes this client was written and recorded against, and the
# oldest server it accepts (55: requests report WAITING; 50: launch credentials).
CLIENT_API_VERSION = 62
CLIENT_VERSION = "0.14.1"
MIN_SERVER_API_VERSION = 55
API_VERSION_HEADER = "X-SkyPilot-API-Version"
VERSION_HEADER = "X-SkyPilot-Version"
REQUEST_ID_HEADER = "X-Skypilot-Request-ID"

REQUEST_ACTIVE = ("PENDING", "WAITING", "RUNNING")
LAUNCH_REQUEST_NAME = "sky.launch"
REQUEST_FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")

# SkyPilot job states (sky.skylet.job_lib.JobStatus) in the shared vocabulary.
JOB_STATES: dict[str, JobState] = {
    "INIT": JobState.PENDING,
    "PENDING": JobState.PENDING,
    "SETTING_UP": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.COMPLETE,
    "FAILED": JobState.ERROR,
    "FAILED_SETUP": JobState.ERROR,
    "FAILED_DRIVER": JobState.ERROR,
    "CANCELLED": JobState.CANCELED,
}

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CONTROL_RE = re.compile(
    r"<(rich_init|rich_start|rich_stop|rich_exit|rich_update|heartbeat|retry)>.*?</\1>"
    r"|<sky-payload[^>]*>.*?</sky-payload>",
    re.S,
)


_DAG_NAME_RE = re.compile(r"name: ([A-Za-z0-9][A-Za-z0-9._-]{0,127})\n")
_TREE_RE = re.compile(r"^\s*[├└│]──\s*")
_TERMINAL_ONLY = ("(Ctrl-C to exit log streaming", "Waiting for 'sky.", "[?25h", "[?25l")


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


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


def strip_control(text: str) -> str:
    """``text`` without SkyPilot's spinner, heartbeat and payload control codes."""
    return _CONTROL_RE.sub("", text)


def clean_log_line(line: str) -> str | None:
    """A job log line without ANSI codes, SkyPilot's spinner/payload control codes and its tree glyphs;
    None for lines that only address an interactive terminal."""
    text = _CONTROL_RE.sub("", strip_ansi(line)).replace("\r", "").rstrip("\n")
    if any(marker in text for marker in _TERMINAL_ONLY):
        return None
    text = _TREE_RE.sub("", text)
    return text if text.strip() else None


def user_hash(user: str) -> str:
    """SkyPilot identifies a user by an 8-hex-digit hash; a stable one per service user name."""
    return hashlib.sha256(f"npa-airflow:{user}".encode()).hexdigest()[:8]


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class ApiRequest:
    method: str
    path: str
    params: Mapping[str, Any] | None = None
    body: Mapping[str, Any] | None = None
    # Whether resending after a transport error is harmless (reads, cancels; never a launch).
    idempotent: bool = True


@dataclass(frozen=True)
class Identity:
    """Who the requests are from, and the client-config override sent with each one."""

    user: str = "airflow"
    config_overrides: Mapping[str, Any] = field(default_factory=dict)

    def body(self, **fields: Any) -> dict[str, Any]:
        return {
            "env_vars": {"SKYPILOT_USER_ID": user_hash(self.user), "SKYPILOT_USER": self.user},
            "entrypoint": "npa-airflow",
            "entrypoint_command": "npa-airflow",
            "using_remote_api_server": True,
            "override_skypilot_config": dict(self.config_overrides),
            **fields,
        }


def build_health() -> ApiRequest:
    return ApiRequest("GET", "/api/health")


def build_launch(identity: Identity, task_yaml: str, cluster: str, *, retry_until_up: bool = False) -> ApiRequest:
    body = identity.body(task=task_yaml, cluster_name=cluster, retry_until_up=retry_until_up)
    return ApiRequest("POST", "/launch", body=body, idempotent=False)


def build_job_status(identity: Identity, cluster: str, job_ids: Sequence[int]) -> ApiRequest:
    return ApiRequest(
        "POST", "/job_status", body=identity.body(cluster_name=cluster, job_ids=[int(j) for j in job_ids])
    )


def build_status(identity: Identity, clusters: Sequence[str] | None = None) -> ApiRequest:
    # include_credentials=False: the default would return the cluster's SSH private key.
    body = identity.body(
        cluster_names=list(clusters) if clusters is not None else None,
        refresh="NONE",
        all_users=True,
        include_credentials=False,
        include_handle=False,
    )
    return ApiRequest("POST", "/status", body=body)


def build_cancel_job(identity: Identity, cluster: str, job_id: int) -> ApiRequest:
    body = identity.body(
        cluster_name=cluster, job_ids=[int(job_id)], all=False, all_users=False, try_cancel_if_cluster_is_init=True
    )
    return ApiRequest("POST", "/cancel", body=body)


def build_down(identity: Identity, cluster: str) -> ApiRequest:
    return ApiRequest("POST", "/down", body=identity.body(cluster_name=cluster, purge=False))


def build_logs(identity: Identity, cluster: str, job_id: int, *, follow: bool, tail: int = 0) -> ApiRequest:
    body = identity.body(cluster_name=cluster, job_id=int(job_id), follow=follow, tail=int(tail))
    return ApiRequest("POST", "/logs", body=body)


def build_request_log(request_id: str) -> ApiRequest:
    """The log of a request (a launch's provisioning output), followed until the request ends."""
    params = {"request_id": _check_request_id(request_id), "follow": "true", "format": "plain"}
    return ApiRequest("GET", "/api/stream", params=params)


def build_cluster_requests(cluster: str) -> ApiRequest:
    """Every request the server still holds for ``cluster`` (finished ones too; kept 24 h by default)."""
    return ApiRequest("GET", "/api/status", params={"cluster_name": cluster, "all_status": "true"})


def build_queue(identity: Identity, cluster: str) -> ApiRequest:
    """The jobs of a cluster, every user's, finished ones too (fails with ClusterDoesNotExist/NotUp)."""
    body = identity.body(cluster_name=cluster, skip_finished=False, all_users=True)
    return ApiRequest("POST", "/queue", body=body)


def build_get(request_id: str) -> ApiRequest:
    return ApiRequest("GET", "/api/get", params={"request_id": _check_request_id(request_id)})


def build_request_status(request_ids: Sequence[str]) -> ApiRequest:
    ids = [_check_request_id(r) for r in request_ids]
    if not ids:
        raise NpaValidationError("request status needs at least one request id")
    return ApiRequest("GET", "/api/status", params={"request_ids": ids, "all_status": "true"})


def build_api_cancel(identity: Identity, request_ids: Sequence[str]) -> ApiRequest:
    """Cancel exactly these requests. An empty or null list is refused: the server would cancel all."""
    ids = [_check_request_id(r) for r in (request_ids or [])]
    if not ids:
        raise NpaValidationError(
            "request_ids is empty: /api/cancel without ids cancels every request of the user; "
            "give the ids of the requests to cancel"
        )
    return ApiRequest("POST", "/api/cancel", body=identity.body(request_ids=ids, user_id=user_hash(identity.user)))


def _check_request_id(request_id: str) -> str:
    if not isinstance(request_id, str) or not REQUEST_ID_RE.fullmatch(request_id):
        raise NpaValidationError(f"request_id={request_id!r} is not a SkyPilot request id (a UUID)")
    return request_id


def headers(token: str | None) -> dict[str, str]:
    result = {API_VERSION_HEADER: str(CLIENT_API_VERSION), VERSION_HEADER: CLIENT_VERSION}
    if token:
        result["Authorization"] = f"Bearer {token}"
    return result


# ---------------------------------------------------------------- answers


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


def interpret_job_state(native: str | None) -> JobState:
    if native is None:
        return JobState.UNKNOWN
    return JOB_STATES.get(native.upper(), JobState.UNKNOWN)


def parse_queue(return_value: Any) -> dict[int, str]:
    """``/queue`` result -> {job id: native state}."""
    if not isinstance(return_value, list):
        raise NpaParseError(f"queue result is not a list: {_short(return_value)}")
    jobs = {}
    for record in return_value:
        if isinstance(record, dict) and isinstance(record.get("job_id"), int) and record.get("status") is not None:
            jobs[record["job_id"]] = str(record["status"])
    return jobs


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
