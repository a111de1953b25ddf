"""Extra links to a task's job (visible while the task is still waiting).

Airflow 3 computes a link in the task's own process, with the live operator, when a try defers or ends, and the UI
shows what it stored. The operator says which job it has (`linked_job`): a step that submitted nothing (a
conversion that reused its image) then asks for no XCom, whose absence Airflow's client logs as an error."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.configuration import conf
from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom

from npa_airflow.common import xcom_keys

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.sdk import BaseOperator

log = logging.getLogger(__name__)

_URL_FIELDS = ("job_id", "cluster", "job_name", "login_host", "results_dir")


def _linked_handle(operator: Any, key: str, ti_key: TaskInstanceKey) -> Any:
    """The operator's own job handle (a dict, or None: it has none), else the handle in the task's XCom."""
    linked = getattr(operator, "linked_job", None)
    return linked() if callable(linked) else XCom.get_value(key=key, ti_key=ti_key)


def airflow_xcom_url(ti_key: TaskInstanceKey) -> str:
    """The task instance's XCom tab in the Airflow UI (where the full handle is shown)."""
    base = conf.get("api", "base_url", fallback="").rstrip("/")
    path = f"/dags/{quote(ti_key.dag_id)}/runs/{quote(ti_key.run_id)}/tasks/{quote(ti_key.task_id)}"
    if ti_key.map_index is not None and ti_key.map_index >= 0:
        path += f"/mapped/{ti_key.map_index}"
    return f"{base}{path}/xcom"


def format_job_url(template: str, handle: dict[str, Any]) -> str:
    """Fill a site URL template such as ``https://ood.example/activejobs?jobid={job_id}`` (values URL-quoted)."""
    values = {k: quote(str(handle.get(k) or ""), safe="") for k in _URL_FIELDS}
    return template.format(**values)


class SlurmJobLink(BaseOperatorLink):
    """The Slurm job of this task: the connection's ``job_url_template`` page, else the task's XCom tab."""

    name = "Slurm job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        handle = _linked_handle(operator, xcom_keys.SLURM_JOB, ti_key)
        if not isinstance(handle, dict) or not handle.get("job_id"):
            return ""
        template = _job_url_template(handle.get("conn_id"))
        if template:
            try:
                return format_job_url(template, handle)
            except (KeyError, IndexError, ValueError) as exc:
                log.warning("job_url_template %r of connection %s is invalid: %s", template, handle["conn_id"], exc)
        return airflow_xcom_url(ti_key)


def _job_url_template(conn_id: str | None) -> str | None:
    return _extra_value(conn_id, "job_url_template")


_BURST_URL_FIELDS = ("endpoint", "cluster", "job_id", "request_id", "name")
DEFAULT_BURST_URL_TEMPLATE = "{endpoint}/dashboard/clusters/{cluster}"


def format_burst_url(template: str, handle: dict[str, Any]) -> str:
    """Fill a dashboard URL template; ``endpoint`` is used as-is, the other values are URL-quoted."""
    values = {k: quote(str(handle.get(k) if handle.get(k) is not None else ""), safe="") for k in _BURST_URL_FIELDS}
    values["endpoint"] = str(handle.get("endpoint") or "").rstrip("/")
    return template.format(**values)


class BurstJobLink(BaseOperatorLink):
    """The burst cluster in the SkyPilot dashboard (the connection's ``dashboard_url_template``, if set)."""

    name = "SkyPilot cluster"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        handle = _linked_handle(operator, xcom_keys.BURST_JOB, ti_key)
        if not isinstance(handle, dict) or not handle.get("cluster") or not handle.get("endpoint"):
            return ""
        template = _extra_value(handle.get("conn_id"), "dashboard_url_template") or DEFAULT_BURST_URL_TEMPLATE
        try:
            return format_burst_url(template, handle)
        except (KeyError, IndexError, ValueError) as exc:
            log.warning("dashboard_url_template %r of connection %s is invalid: %s", template, handle["conn_id"], exc)
            return format_burst_url(DEFAULT_BURST_URL_TEMPLATE, handle)


def _extra_value(conn_id: str | None, key: str) -> str | None:
    """A non-blank string from the connection's extra, else None (also when the connection cannot be read)."""
    if not conn_id:
        return None
    try:
        # DAG parse: BaseHook (airflow.sdk.bases.hook) loads only when a link is shown
        from airflow.sdk import BaseHook

        extra = BaseHook.get_connection(conn_id).extra_dejson
    except Exception:  # a link must never fail the task
        return None
    value = extra.get(key)
    return value if isinstance(value, str) and value.strip() else None
