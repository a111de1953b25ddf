"""Extra links that read the job handle an operator pushed to XCom (visible while the task is still waiting)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.sdk import BaseOperator

log = logging.getLogger(__name__)

SLURM_XCOM_KEY = "slurm_job"
_URL_FIELDS = ("job_id", "cluster", "job_name", "login_host", "results_dir")


def airflow_xcom_url(ti_key: TaskInstanceKey) -> str:
    """The task instance's XCom tab in the Airflow UI (where the full handle is shown)."""
    from airflow.configuration import conf

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
        handle = XCom.get_value(key=SLURM_XCOM_KEY, ti_key=ti_key)
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
    if not conn_id:
        return None
    try:
        from airflow.sdk import BaseHook

        extra = BaseHook.get_connection(conn_id).extra_dejson
    except Exception:  # a link must never fail the task
        return None
    value = extra.get("job_url_template")
    return value if isinstance(value, str) and value.strip() else None
