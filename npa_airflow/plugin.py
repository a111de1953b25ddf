"""Airflow plugin: a task instance of this provider that a user ends from the UI or API has its job cancelled.

Marking a task failed or successful, or setting its run to failed, reaches a running trigger's `on_kill`. But
a task marked in the first second after it deferred has no trigger running yet: Airflow deletes the trigger
row before any triggerer has loaded it, no `on_kill` ever runs, and the job would run on, orphaned. This
listener closes that window. Airflow calls it in the API server right after such a state change; it reads the
job handle the task left in XCom (`slurm_job` or `burst_job`) and cancels that job in the background.
With a trigger running as well, both cancel: `scancel` of an ended job and a second SkyPilot cancel are no-ops.

Only a task instance that has ended for good (FAILED or SUCCESS in the database) is acted on, never one going
up for retry (its next try reattaches to the job), and never from a worker (whose operator handles its own job).
The handle is only a pointer: what is cancelled is derived from the task instance, this deployment and the
serialized task (npa_airflow.trusted_jobs); a handle that is not the task instance's own is logged and ignored.

The listener runs in the thread of the API request that ended the task. It reads the database there, then hands
the remote work to the process's background loop and returns: marking a run of 1,000 tasks failed starts no
thread per task, its Slurm cancels meet in one scancel per cluster (npa_airflow.slurm.transport.kill_batch), and a
cluster or SkyPilot server that does not answer costs waiting coroutines with a time bound, not the API server's
threads.

The plugin also creates this deployment's identity (npa_airflow.common.deployment) when the scheduler, triggerer
or dag processor starts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import time
import weakref
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

from npa_airflow.common import xcom_keys
from npa_airflow.compute.mount import URL_PREFIX as COMPUTE_URL_PREFIX
from npa_airflow.compute.mount import LazyApp

log = logging.getLogger(__name__)

FINAL_STATES = ("failed", "success")
CANCEL_TIMEOUT = 120.0  # a Slurm cancel rides out a cluster outage this long, then is reported as failed
BURST_TIMEOUT = 120.0  # the SkyPilot requests of one Burst cancel (submitted only: the server carries them out)
BURST_CONCURRENCY = 8  # Burst cancels in flight at once per API server process
CONN_ATTRS = {xcom_keys.SLURM_JOB: "slurm_conn_id", xcom_keys.BURST_JOB: "skypilot_conn_id"}
CONFIG_SECONDS = 30.0
_configs: dict[str, tuple[float, Any]] = {}
_burst_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _is_database_row(task_instance: Any) -> bool:
    """True for the metadata database's TaskInstance (API server, scheduler), False in a worker."""
    return type(task_instance).__module__ == "airflow.models.taskinstance"


def _handles(task_instance: Any) -> dict[str, Any]:
    """The job handles in this task instance's XCom, by key."""
    # Airflow internals (ORM): only the API server reads the handles
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
                XComModel.key.in_((xcom_keys.SLURM_JOB, xcom_keys.BURST_JOB)),
            )
        ).all()
    return {row.key: XComModel.deserialize_value(row) for row in rows}


def _named(task_instance: Any) -> str:
    ti = task_instance
    index = f"[{ti.map_index}]" if ti.map_index is not None and ti.map_index >= 0 else ""
    return f"{ti.dag_id}.{ti.task_id}{index} of run {ti.run_id} (try {ti.try_number})"


def _slurm_config(conn_id: str) -> Any:
    """The connection's config, read at most once per CONFIG_SECONDS in this process: marking a run of 1,000
    tasks failed calls the listener 1,000 times in one request."""
    # every Airflow process loads the plugin: the hook (asyncssh) only where a cancel runs
    from npa_airflow.slurm.hook import SlurmHook

    now = time.monotonic()
    cached = _configs.get(conn_id)
    if cached is None or now - cached[0] > CONFIG_SECONDS:
        cached = _configs[conn_id] = (now, SlurmHook(slurm_conn_id=conn_id).config)
    return cached[1]


def _ti_ref(task_instance: Any) -> Any:
    # every Airflow process loads the plugin: the job checks only where a cancel runs
    from npa_airflow.trusted_jobs import TaskInstanceRef

    ti = task_instance
    return TaskInstanceRef(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, int(ti.try_number or 1))


def slurm_cancel(task_instance: Any, raw: Any) -> Any:
    """The cancel of the task instance's Slurm job (a coroutine), or None when its handle is not its own."""
    # every Airflow process loads the plugin: the job checks and cancels only where a cancel runs
    from npa_airflow.common.deployment import current_deployment
    from npa_airflow.slurm.transport.cancels import CancelRequest
    from npa_airflow.trusted_jobs import Distrust, dropped_paths, task_settings, trusted_slurm_handle

    settings = task_settings(task_instance.dag_version_id, task_instance.task_id, CONN_ATTRS[xcom_keys.SLURM_JOB])
    if settings is None or settings.conn_id is None:
        log.warning("Not cancelling the Slurm job of %s: its serialized task cannot be read", _named(task_instance))
        return None
    job = trusted_slurm_handle(
        raw, _ti_ref(task_instance), settings, current_deployment(), _slurm_config(settings.conn_id)
    )
    if isinstance(job, Distrust):
        log.warning("Not acting on the Slurm job handle in the XCom of %s: %s", _named(task_instance), job.reason)
        return None
    if dropped := dropped_paths(raw, job):
        log.warning(
            "Ignoring paths in the handle of %s that the job's layout does not derive: %s",
            _named(task_instance),
            dropped,
        )
    return _cancel_slurm(job, CancelRequest.for_handle(job))


async def _cancel_slurm(job: Any, request: Any) -> None:
    """scancel the job (recording that Airflow did, so clearing the task later runs it again), retried while the
    cluster does not answer; a cancel that did not happen raises (and is logged as a failure)."""
    # every Airflow process loads the plugin: the channel (the hook, asyncssh) only where a cancel runs
    from npa_airflow.common.retry import Backoff, Budget, aretry
    from npa_airflow.exceptions import cluster_did_not_answer
    from npa_airflow.slurm.transport.channel import get_channel

    kills = get_channel(job.conn_id, cluster=job.cluster).kills
    outcome = await aretry(
        lambda: kills.cancel(request),
        transient=cluster_did_not_answer,
        backoff=Backoff(base=2.0, cap=15.0, jitter=0.5),
        budget=Budget(seconds=CANCEL_TIMEOUT),
    )
    if outcome == "ended":
        log.info("Slurm job %s (%s) had already ended: nothing to cancel", job.job_id, job.job_name)
    else:
        log.info("Cancelled Slurm job %s (%s): its task instance was ended by a user", job.job_id, job.job_name)


def burst_cancel(task_instance: Any, raw: Any) -> Any:
    """The cancel and teardown of the task instance's Burst launch (a coroutine), or None when its handle is not
    its own."""
    # every Airflow process loads the plugin: the job checks only where a cancel runs
    from npa_airflow.common.deployment import current_deployment
    from npa_airflow.trusted_jobs import Distrust, task_settings, trusted_burst_try

    settings = task_settings(task_instance.dag_version_id, task_instance.task_id, CONN_ATTRS[xcom_keys.BURST_JOB])
    if settings is None or settings.conn_id is None:
        log.warning("Not cancelling the Burst launch of %s: its serialized task cannot be read", _named(task_instance))
        return None
    ref = trusted_burst_try(raw, _ti_ref(task_instance), settings, current_deployment())
    if isinstance(ref, Distrust):
        log.warning("Not acting on the Burst job handle in the XCom of %s: %s", _named(task_instance), ref.reason)
        return None
    return _cancel_burst(settings, ref)


async def _cancel_burst(settings: Any, ref: Any) -> None:
    """Cancel what the try left on the SkyPilot API server (found by its name, as a retry would) and take the
    cluster down if the task's policy says so; the requests are only submitted, within BURST_TIMEOUT."""
    # every Airflow process loads the plugin: the SkyPilot hook (httpx) only where a cancel runs
    from npa_airflow.burst.hook import SkyPilotHook

    loop = asyncio.get_running_loop()
    slots = _burst_slots.get(loop) or _burst_slots.setdefault(loop, asyncio.Semaphore(BURST_CONCURRENCY))
    async with slots, SkyPilotHook(settings.conn_id) as hook:
        await asyncio.wait_for(_cancel_try(hook, settings, ref), BURST_TIMEOUT)


async def _cancel_try(hook: Any, settings: Any, ref: Any) -> None:
    # every Airflow process loads the plugin: the SkyPilot client only where a cancel runs
    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.tries import observe_tries

    (found,) = await observe_tries(hook, [ref])
    created = not ref.pinned
    teardown = settings.teardown or ("down" if created else "keep")
    if found.found:
        handle = BurstJobHandle(
            conn_id=settings.conn_id,
            endpoint=(await hook.aconfig()).endpoint,
            cluster=ref.cluster,
            name=ref.try_name,
            request_id=found.request.request_id if found.request else None,
            job_id=found.job_id,
            created_cluster=created,
            teardown=teardown,
            try_name=ref.try_name,
        )
        await hook.acancel_and_teardown(handle, log, wait=False)
    elif created and teardown == "down" and found.cluster_status is not None:
        await hook.ateardown(ref.cluster, log, wait=False)
    else:
        log.info("Burst try %s left nothing to cancel on the API server", ref.try_name)
        return
    log.info(
        "Cancelled the Burst launch of try %s (cluster %s): its task instance was ended by a user",
        *(ref.try_name, ref.cluster),
    )


CANCELLERS = {xcom_keys.SLURM_JOB: slurm_cancel, xcom_keys.BURST_JOB: burst_cancel}


def cancel_jobs_of(task_instance: Any) -> concurrent.futures.Future | None:
    """Start cancelling the jobs of an ended task instance on the background loop (None: nothing to do)."""
    state = getattr(task_instance.state, "value", task_instance.state)
    if not _is_database_row(task_instance) or state not in FINAL_STATES:
        return None
    try:
        handles = _handles(task_instance)
    except Exception:
        log.exception("Could not read the job handles of %s", _named(task_instance))
        return None
    cancels = []
    for key, raw in handles.items():
        try:
            cancel = CANCELLERS[key](task_instance, raw)
        except Exception:
            log.exception("Could not work out the job of %s to cancel (%s)", _named(task_instance), key)
            continue
        if cancel is not None:
            cancels.append((key, cancel))
    if not cancels:
        return None
    # every Airflow process loads the plugin: the background loop only where a cancel runs
    from npa_airflow.common.background_loop import spawn

    async def cancel_all() -> None:
        for key, cancel in cancels:
            try:
                await cancel
            except Exception:
                log.exception("Could not cancel the job of %s (%s)", _named(task_instance), key)

    return spawn(cancel_all())


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    cancel_jobs_of(task_instance)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    cancel_jobs_of(task_instance)


@hookimpl
def on_starting(component: Any) -> None:
    """A scheduler, triggerer or dag processor starts (they have database access): make sure this deployment has
    its identity before any task needs it."""
    if type(component).__module__ != "airflow.jobs.job":
        return
    # every Airflow process loads the plugin: the deployment only where the identity is created
    from npa_airflow.common.deployment import ensure_identity

    try:
        ensure_identity()
    except Exception:
        log.exception("Could not create this deployment's npa-airflow identity; tasks will say so")


def _compute_app() -> Any:
    """The Compute page's FastAPI app (built on its first request)."""
    # every Airflow process loads the plugin: FastAPI and the page's sources load on the first request
    from npa_airflow.compute.app import create_app

    return create_app()


class NpaAirflowPlugin(AirflowPlugin):
    """Registers the listener above and the Compute page (entry point `airflow.plugins`).

    The page is a FastAPI app mounted in the API server at ``/npa-compute``; the external view puts it in the
    UI's navigation (shown inside the UI at ``/plugin/compute``). See npa_airflow/compute/app.py.
    """

    name = "npa_airflow"
    listeners = [sys.modules[__name__]]  # the hooks above
    fastapi_apps = [{"name": "npa_compute", "app": LazyApp(_compute_app), "url_prefix": COMPUTE_URL_PREFIX}]
    external_views = [
        {
            "name": "Compute",
            "href": f"{COMPUTE_URL_PREFIX}/",
            "url_route": "compute",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
