"""The burst job handle: what finds, watches and cancels one launch (the seed's ``--json`` handle).

It travels as JSON (XCom key ``burst_job``, trigger kwargs), so ``from_dict`` validates every field.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from npa_airflow.burst.task import TEARDOWN_POLICIES, validate_cluster_name
from npa_airflow.common.checks import field_mismatch
from npa_airflow.exceptions import NpaValidationError

_CONN_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,250}")
# A SkyPilot request id (a UUID); the protocol checks ids against the same pattern.
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{7,63}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class BurstJobHandle:
    conn_id: str
    endpoint: str
    cluster: str
    name: str
    request_id: str | None  # the launch request (None only for a job adopted after the server dropped it)
    job_id: int | None = None  # known once the launch request has finished
    created_cluster: bool = True  # the task brought the cluster up (so it takes it down by default)
    teardown: str = "down"  # applied when the job ends, fails or is cancelled
    submitted_at: float | None = None
    try_name: str | None = None  # the task-instance try that launched it (the launch's DAG name)

    def __post_init__(self) -> None:
        if not isinstance(self.conn_id, str) or not _CONN_ID_RE.fullmatch(self.conn_id):
            raise NpaValidationError(f"BurstJobHandle.conn_id={self.conn_id!r} is not a connection id")
        if not isinstance(self.endpoint, str) or not self.endpoint.startswith(("http://", "https://")):
            raise NpaValidationError(f"BurstJobHandle.endpoint={self.endpoint!r} is not an http(s) URL")
        validate_cluster_name(self.cluster, "BurstJobHandle.cluster")
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise NpaValidationError(f"BurstJobHandle.name={self.name!r} is not a job name")
        if self.request_id is None and self.job_id is None:
            raise NpaValidationError("BurstJobHandle needs the launch request_id until the job_id is known")
        if self.request_id is not None and (
            not isinstance(self.request_id, str) or not REQUEST_ID_RE.fullmatch(self.request_id)
        ):
            raise NpaValidationError(f"BurstJobHandle.request_id={self.request_id!r} is not a request id")
        if self.job_id is not None and (
            isinstance(self.job_id, bool) or not isinstance(self.job_id, int) or self.job_id < 0
        ):
            raise NpaValidationError(f"BurstJobHandle.job_id={self.job_id!r} is not a SkyPilot job id")
        if not isinstance(self.created_cluster, bool):
            raise NpaValidationError(f"BurstJobHandle.created_cluster={self.created_cluster!r} must be a bool")
        if self.teardown not in TEARDOWN_POLICIES:
            raise NpaValidationError(f"BurstJobHandle.teardown={self.teardown!r}: use one of {TEARDOWN_POLICIES}")
        if self.submitted_at is not None and not isinstance(self.submitted_at, (int, float)):
            raise NpaValidationError(f"BurstJobHandle.submitted_at={self.submitted_at!r} must be epoch seconds")
        if self.try_name is not None and (not isinstance(self.try_name, str) or not _NAME_RE.fullmatch(self.try_name)):
            raise NpaValidationError(f"BurstJobHandle.try_name={self.try_name!r} is not a try name")

    @property
    def tears_down(self) -> bool:
        return self.teardown == "down"

    def with_job(self, job_id: int | None) -> BurstJobHandle:
        return replace(self, job_id=job_id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> BurstJobHandle:
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise NpaValidationError(f"burst job handle is not JSON: {data[:200]!r}") from exc
        if not isinstance(data, dict):
            raise NpaValidationError(f"burst job handle must be a mapping, got {type(data).__name__}")
        unknown, missing = field_mismatch(cls, data, ("conn_id", "endpoint", "cluster", "name", "request_id"))
        if unknown:
            raise NpaValidationError(f"burst job handle has unknown fields {unknown}")
        if missing:
            raise NpaValidationError(f"burst job handle lacks {missing}")
        return cls(**data)

    from_json = from_dict
