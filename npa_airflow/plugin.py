"""Airflow plugin: a task instance of this provider that a user ends from the UI or API has its job cancelled.

Marking a task failed or successful, or setting its run to failed, reaches a running trigger's `on_kill`. But
a task marked in the first second after it deferred has no trigger running yet: Airflow deletes the trigger
row before any triggerer has loaded it, no `on_kill` ever runs, and the job would run on, orphaned. This
listener closes that window. Airflow calls it in the API server right after such a state change; it reads the
job handle the task left in XCom (`slurm_job` or `burst_job`) and cancels that job in the background.
With a trigger running as well, both cancel: `scancel` of an ended job and a second SkyPilot cancel are no-ops.

Only a task instance that has ended for good (FAILED or SUCCESS in the database) is acted on, never one going
up for retry (its next try reattaches to the job), and never from a worker (whose operator handles its own job).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

from npa_airflow.common.links import BURST_XCOM_KEY, SLURM_XCOM_KEY
from npa_airflow.compute.mount import URL_PREFIX as COMPUTE_URL_PREFIX
from npa_airflow.compute.mount import LazyApp

log = logging.getLogger(__name__)

SLURM_KEY = SLURM_XCOM_KEY
BURST_KEY = BURST_XCOM_KEY
FINAL_STATES = ("failed", "success")
CANCEL_TIMEOUT = 120.0


def _is_database_row(task_instance: Any) -> bool:
    """True for the metadata database's TaskInstance (API server, scheduler), False in a worker."""
    return type(task_instance).__module__ == "airflow.models.taskinstance"


def _handles(task_instance: Any) -> dict[str, Any]:
    """The job handles in this task instance's XCom, by key."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(XComModel.key, XComModel.value).where(
                XComModel.dag_id == task_instance.dag_id,
                XComModel.run_id == task_instance.run_id,
                XComModel.task_id == task_instance.task_id,
                XComModel.map_index == task_instance.map_index,
                XComModel.key.in_((SLURM_KEY, BURST_KEY)),
            )
        ).all()
    return {row.key: XComModel.deserialize_value(row) for row in rows}


def cancel_slurm_job(handle: dict[str, Any]) -> None:
    """scancel the job (recording that Airflow did, so clearing the task later runs it again), retried while the
    cluster does not answer; a cancel that did not happen raises (and is logged as a failure).

    Marking a DAG run of 1,000 waiting tasks failed starts 1,000 of these threads at once: their cancels meet on
    the process's one background loop and go out in one scancel per cluster (`npa_airflow.slurm.kill_batch`).
    """
    from npa_airflow.common.background_loop import run_sync
    from npa_airflow.common.retry import Backoff, Budget, retry
    from npa_airflow.exceptions import cluster_did_not_answer
    from npa_airflow.slurm.cancels import CancelRequest
    from npa_airflow.slurm.commands import cancel_marker_for
    from npa_airflow.slurm.handle import SlurmJobHandle

    job = SlurmJobHandle.from_dict(handle)
    marker = cancel_marker_for(job.script_path) if job.script_path else None
    request = CancelRequest(job.job_id, marker, tuple(job.secret_files))
    outcome = retry(
        lambda: run_sync(_cancel_in_batch(job.conn_id, job.cluster, request)),
        transient=cluster_did_not_answer,
        backoff=Backoff(base=2.0, cap=15.0, jitter=0.5),
        budget=Budget(seconds=CANCEL_TIMEOUT),
    )
    if outcome == "ended":
        log.info("Slurm job %s (%s) had already ended: nothing to cancel", job.job_id, job.job_name)
    else:
        log.info("Cancelled Slurm job %s (%s): its task instance was ended by a user", job.job_id, job.job_name)


async def _cancel_in_batch(conn_id: str, cluster: str | None, request: Any) -> str:
    from npa_airflow.slurm.poller import get_poller

    return await get_poller(conn_id, cluster=cluster).kills.cancel(request)


def cancel_burst_job(handle: dict[str, Any]) -> None:
    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.hook import SkyPilotHook

    job = BurstJobHandle.from_dict(handle)
    with SkyPilotHook(job.conn_id) as hook:
        hook.cancel_and_teardown(job, log, cancel=True, teardown=True)
    log.info("Cancelled burst job %s: its task instance was ended by a user", job.to_json())


CANCELLERS = {SLURM_KEY: cancel_slurm_job, BURST_KEY: cancel_burst_job}


def cancel_jobs_of(task_instance: Any) -> threading.Thread | None:
    """Start cancelling the jobs of an ended task instance in a background thread (None: nothing to do)."""
    state = getattr(task_instance.state, "value", task_instance.state)
    if not _is_database_row(task_instance) or state not in FINAL_STATES:
        return None
    try:
        handles = _handles(task_instance)
    except Exception:
        log.exception("Could not read the job handles of %s", task_instance)
        return None
    if not handles:
        return None

    def cancel_all() -> None:
        for key, handle in handles.items():
            try:
                CANCELLERS[key](handle)
            except Exception:
                log.exception("Could not cancel the job of %s (%s=%s)", task_instance.task_id, key, handle)

    thread = threading.Thread(target=cancel_all, name=f"npa-cancel-{task_instance.task_id}", daemon=True)
    thread.start()
    return thread


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    cancel_jobs_of(task_instance)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    cancel_jobs_of(task_instance)


class NpaAirflowPlugin(AirflowPlugin):
    """Registers the listener above and the Compute page (entry point `airflow.plugins`).

    The page is a FastAPI app mounted in the API server at ``/npa-compute``; the external view puts it in the
    UI's navigation (shown inside the UI at ``/plugin/compute``). See npa_airflow/compute/app.py.
    """

    name = "npa_airflow"
    listeners = [sys.modules[__name__]]  # the two hooks above
    fastapi_apps = [{"name": "npa_compute", "app": LazyApp(), "url_prefix": COMPUTE_URL_PREFIX}]
    external_views = [
        {
            "name": "Compute",
            "href": f"{COMPUTE_URL_PREFIX}/",
            "url_route": "compute",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
