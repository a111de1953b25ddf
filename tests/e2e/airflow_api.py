"""A small client for the REST API the Airflow 3 UI uses (the public /api/v2 plus /ui and /auth)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

TERMINAL_TI_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


class AirflowApiError(AssertionError):
    """An unexpected answer from the API, with the status and body for the test report."""


@dataclass
class AirflowApi:
    base_url: str
    username: str
    password: str
    timeout: float = 30.0
    _token: str | None = field(default=None, init=False, repr=False)
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout)

    def close(self) -> None:
        self._client.close()

    # -- transport ---------------------------------------------------------------------------------------
    def token(self) -> str:
        """POST /auth/token (simple auth manager), the same call the UI's login form makes."""
        r = self._client.post("/auth/token", json={"username": self.username, "password": self.password})
        _expect(r, 201)
        self._token = r.json()["access_token"]
        return self._token

    def request(self, method: str, path: str, *, expect: Iterable[int] = (200,), **kw: Any) -> httpx.Response:
        for attempt in (1, 2):
            if self._token is None:
                self.token()
            headers = {"Authorization": f"Bearer {self._token}", **kw.pop("headers", {})}
            r = self._client.request(method, path, headers=headers, **kw)
            if r.status_code == 401 and attempt == 1:
                self._token = None  # expired: log in again once
                continue
            _expect(r, *expect)
            return r
        raise AssertionError("unreachable")

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    # -- DAGs and runs -----------------------------------------------------------------------------------
    def import_errors(self) -> list[dict]:
        return self.get("/api/v2/importErrors", params={"limit": 100})["import_errors"]

    def wait_for_dag(self, dag_id: str, timeout: float = 90) -> dict:
        """Wait until the dag-processor has parsed and serialised the DAG; fail early on an import error."""

        def probe() -> dict | None:
            r = self.request("GET", f"/api/v2/dags/{_q(dag_id)}", expect=(200, 404))
            if r.status_code == 200:
                return r.json()
            if errors := self.import_errors():
                raise AirflowApiError(f"import errors while waiting for {dag_id}: {errors}")
            return None

        return poll(probe, timeout, f"DAG {dag_id} parsed")

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{_q(dag_id)}", json={"is_paused": False})

    def trigger(
        self, dag_id: str, conf: dict | None = None, *, run_id: str | None = None, logical_date: str | None = None
    ) -> str:
        """Trigger a run now (unpausing the DAG first) and return its run id (``run_id``: that one)."""
        self.unpause(dag_id)
        body: dict[str, Any] = {"logical_date": logical_date, "conf": conf or {}}
        if run_id is not None:
            body["dag_run_id"] = run_id
        r = self.request("POST", f"/api/v2/dags/{_q(dag_id)}/dagRuns", json=body)
        return r.json()["dag_run_id"]

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}")

    # -- task instances ----------------------------------------------------------------------------------
    def _ti_path(self, dag_id: str, run_id: str, task_id: str) -> str:
        return f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances/{_q(task_id)}"

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.get(self._ti_path(dag_id, run_id, task_id))

    def wait_for_state(
        self, dag_id: str, run_id: str, task_id: str, states: Iterable[str], timeout: float = 120
    ) -> dict:
        """Poll the task instance until its state is one of `states`; fail if it ends in another."""
        wanted = set(states)

        def probe() -> dict | None:
            ti = self.task_instance(dag_id, run_id, task_id)
            if ti["state"] in wanted:
                return ti
            if ti["state"] in TERMINAL_TI_STATES:
                log = "\n".join(self.log_lines(dag_id, run_id, task_id, ti["try_number"]))
                raise AirflowApiError(f"{task_id} ended {ti['state']}, wanted {sorted(wanted)}; log:\n{log}")
            return None

        return poll(probe, timeout, f"{dag_id}.{task_id} in {sorted(wanted)}")

    def log_lines_while_unfinished(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[str]:
        """The task log, failing at once (with the log) if the task instance has already ended."""
        lines = self.log_lines(dag_id, run_id, task_id, try_number)
        state = self.task_instance(dag_id, run_id, task_id)["state"]
        if state in TERMINAL_TI_STATES:
            raise AirflowApiError(f"{task_id} ended {state} while waiting for its log; log:\n" + "\n".join(lines))
        return lines

    def set_state(self, dag_id: str, run_id: str, task_id: str, new_state: str) -> list[dict]:
        """PATCH new_state: what "Mark as failed/success" does in the UI."""
        r = self.request("PATCH", self._ti_path(dag_id, run_id, task_id), json={"new_state": new_state})
        return r.json()["task_instances"]

    def log_lines(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> list[str]:
        """The task's log as the UI shows it: one string per structured log event."""
        r = self.request(
            "GET",
            f"{self._ti_path(dag_id, run_id, task_id)}/logs/{try_number}",
            params={"full_content": "true", **({"map_index": map_index} if map_index >= 0 else {})},
            headers={"Accept": "application/json"},
        )
        return [_event_text(item) for item in r.json()["content"]]

    def extra_links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str | None]:
        return self.get(f"{self._ti_path(dag_id, run_id, task_id)}/links")["extra_links"]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str, map_index: int = -1) -> Any:
        r = self.request(
            "GET",
            f"{self._ti_path(dag_id, run_id, task_id)}/xcomEntries/{_q(key)}",
            params={"deserialize": "true", "map_index": map_index},
            expect=(200, 404),
        )
        return r.json()["value"] if r.status_code == 200 else None

    # -- variables ---------------------------------------------------------------------------------------
    def set_variable(self, key: str, value: str) -> None:
        """Create or replace a Variable, as the UI's Variables page does."""
        body = {"key": key, "value": value}
        r = self.request("POST", "/api/v2/variables", json=body, expect=(201, 409))
        if r.status_code == 409:
            self.request("PATCH", f"/api/v2/variables/{_q(key)}", json=body)

    # -- connections form --------------------------------------------------------------------------------
    def hook_meta(self) -> list[dict]:
        """What the UI's connection form is built from (GET /ui/connections/hook_meta)."""
        return self.get("/ui/connections/hook_meta")


def poll(probe: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """Call `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AirflowApiError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _event_text(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    text = str(item.get("event", ""))
    for err in item.get("error_detail") or []:  # an exception logged with the event: keep its message
        text += f" | {err.get('exc_type')}: {err.get('exc_value')}"
    return text


def _expect(r: httpx.Response, *codes: int) -> None:
    if r.status_code not in codes:
        raise AirflowApiError(f"{r.request.method} {r.request.url} -> {r.status_code}: {r.text[:2000]}")


def _q(part: str) -> str:
    return quote(part, safe="")
