"""The requests this client sends to a SkyPilot API server (``build_*``), pure: method, path, parameters,
body (with the identity the server needs on each) and whether resending it is harmless."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from npa_airflow.burst.client.protocol import API_VERSION_HEADER, CLIENT_API_VERSION, CLIENT_VERSION, VERSION_HEADER
from npa_airflow.burst.handle import REQUEST_ID_RE
from npa_airflow.exceptions import NpaValidationError


def user_hash(user: str) -> str:
    """SkyPilot identifies a user by an 8-hex-digit hash; a stable one per service user name."""
    return hashlib.sha256(f"npa-airflow:{user}".encode()).hexdigest()[:8]


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
