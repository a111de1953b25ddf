"""The lifecycle every Burst operator shares (``BurstLaunchOperatorBase``); the operators are in ``operators.py``.

``BurstTorchrunOperator`` is the seed's ``npa burst submit``; ``BurstSubmitYamlOperator`` its
``submit-yaml``. Both validate everything before the first request, launch from the worker, push the job
handle to XCom (key ``burst_job``), then wait in the triggerer (``BurstJobTrigger``) or, when not
deferrable, on the worker with the same code. Kill -> cancel the launch/job and apply the teardown
policy (``down`` for clusters the task created, ``keep`` for a pinned cluster that already existed).

A try first looks for what earlier tries left, by their names (``burst.adoption.LaunchOrAdopt``): a live launch or
job is adopted (``on_previous_try="reattach"``) or cancelled (``"cancel"``), never launched beside. The outcome
follows the Slurm side: a job that failed by itself fails the task without a retry (``AirflowFailException``, with
the end of its log); a failed launch, a lost cluster or infrastructure evidence in the log is retried; a wait that could
not learn the job's end (API server unreachable past its budget) is retried and leaves job and cluster running
for the next try. The teardown policy applies only when the job ended, was cancelled, or ``max_wait`` passed.
Whatever the outcome, the job's GPU-hours (the event's usage, `burst.usage`) go to XCom `npa_usage` and one line of
the task log before any failure is raised.

Importing this module is cheap: no httpx, no yaml, no SkyPilot at parse time.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.common import xcom_keys
from npa_airflow.common.checks import positive_duration
from npa_airflow.common.defaults import default_deferrable
from npa_airflow.common.links import BurstJobLink
from npa_airflow.common.previous_try import checked_mode
from npa_airflow.common.renamed import renamed
from npa_airflow.common.usage import event_usage, usage_line
from npa_airflow.exceptions import NpaValidationError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.hook import SkyPilotHook
    from npa_airflow.burst.tries import TryRef


def _seconds(value: timedelta | float | int | None, field: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise NpaValidationError(f"{field}={value!r}: give a positive number of seconds or a timedelta")
    return float(seconds)


class BurstLaunchOperatorBase(BaseOperator):
    """Launch (or adopt an earlier try's launch), wait, cancel and tear down; subclasses say what task to launch
    (``build_task_dict``).

    :param max_wait: how long after the launch (a ``timedelta`` or seconds) before the job is cancelled and the
        task fails; a reattached launch keeps its first submission time. ``deadline`` is its old name.
    """

    operator_extra_links = (BurstJobLink(),)
    ui_color = "#d7ecff"

    def __init__(
        self,
        *,
        skypilot_conn_id: str = "skypilot_default",
        cluster_name: str | None = None,
        teardown: str | None = None,
        retry_until_up: bool = False,
        on_previous_try: str = "reattach",
        max_wait: timedelta | float | None = None,
        poll_interval: float = 15.0,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        registry_conn_id: str | None = None,
        deferrable: bool | None = None,
        deadline: timedelta | float | None = None,  # the old name of max_wait
        **kwargs: Any,
    ) -> None:
        owner = f"{type(self).__name__}(task_id={kwargs.get('task_id')!r})"
        max_wait = renamed(owner, "max_wait", max_wait, "deadline", deadline, kwargs.get("default_args"))
        super().__init__(**kwargs)
        self.on_previous_try = checked_mode(on_previous_try, "launch or job", "launching")
        self.skypilot_conn_id = skypilot_conn_id
        self.cluster_name = cluster_name
        self.teardown = teardown
        self.retry_until_up = retry_until_up
        self.max_wait = positive_duration(max_wait, "max_wait")
        self.poll_interval = poll_interval
        self.stream_logs = stream_logs
        self.cancel_on_kill = cancel_on_kill
        self.registry_conn_id = registry_conn_id
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self._handle: BurstJobHandle | None = None
        self._finished = False

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """Airflow's fields, the connection and the pinned cluster: the API server acts on this task's launch with
        what the serialized DAG names, never with what a handle read back from XCom names (npa_airflow.plugin)."""
        return frozenset(super().get_serialized_fields() | {"skypilot_conn_id", "cluster_name"})

    def linked_job(self) -> dict[str, Any] | None:
        """The handle of the launch this try has (the "SkyPilot cluster" link), None before or without one."""
        return self._handle.to_dict() if self._handle is not None else None

    # -- what to launch (subclasses) ---------------------------------------------------------------------

    def build_task_dict(self, context: Context, secrets: dict[str, str]) -> tuple[dict[str, Any], int]:
        """The SkyPilot task dict (with ``secrets`` merged) and its node count."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------------------

    def get_hook(self) -> SkyPilotHook:
        # DAG parse: the hook loads the SkyPilot client (httpx)
        from npa_airflow.burst.hook import SkyPilotHook

        return SkyPilotHook(self.skypilot_conn_id)

    def registry_secrets(self) -> dict[str, str]:
        """SKYPILOT_DOCKER_* from the explicit registry connection only (never from the environment)."""
        if not self.registry_conn_id:
            return {}
        # DAG parse: burst.task is run-time only
        from npa_airflow.burst.task import docker_login_secrets

        conn = self.get_hook().get_connection(self.registry_conn_id)
        server = conn.host or (conn.extra_dejson or {}).get("server")
        return docker_login_secrets(server, conn.login, conn.password)

    def _teardown_for(self, created: bool) -> str:
        # DAG parse: adoption loads the SkyPilot client
        from npa_airflow.burst.adoption import teardown_policy

        return teardown_policy(self.teardown, created)

    def try_refs(self, context: Context) -> list[TryRef]:
        """Every try of this task instance up to the current one (oldest first): its name and its cluster.

        The names are keyed by this deployment (`common.naming`), so another deployment's launch of the same DAG
        run is never one of them."""
        # DAG parse: tries loads the SkyPilot client; the deployment is read only when a task runs
        from npa_airflow.burst.tries import try_refs
        from npa_airflow.common.deployment import current_deployment

        ti = context["ti"]
        identity = (ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None), int(ti.try_number or 1))
        return try_refs(identity, current_deployment(), self.cluster_name)

    def adopt_or_launch(self, hook: SkyPilotHook, context: Context, task: dict[str, Any], nodes: int) -> BurstJobHandle:
        """The launch this try waits for (adopted or new, `LaunchOrAdopt`), pushed to XCom before any wait so a kill
        can find it."""
        # DAG parse: adoption and tries load the SkyPilot client; the deployment is read only when a task runs
        from npa_airflow.burst.adoption import LaunchOrAdopt
        from npa_airflow.burst.tries import legacy_try_refs
        from npa_airflow.common.deployment import current_deployment

        refs = self.try_refs(context)
        ti = context["ti"]
        key = (ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", None))
        legacy = legacy_try_refs(key, len(refs) - 1, self.cluster_name)  # earlier tries only
        with hook:
            handle = LaunchOrAdopt(
                hook,
                refs,
                legacy,
                task,
                self.log,
                conn_id=self.skypilot_conn_id,
                deployment=current_deployment(),
                on_previous_try=self.on_previous_try,
                retry_until_up=self.retry_until_up,
                teardown=self.teardown,
            ).run(nodes)
        self._handle = handle
        context["ti"].xcom_push(key=xcom_keys.BURST_JOB, value=handle.to_dict())
        return handle

    def execute(self, context: Context) -> Any:
        # Everything that can be wrong with the input fails here, before the first request.
        poll = _seconds(self.poll_interval, "poll_interval") or 15.0
        self._teardown_for(True)
        secrets = self.registry_secrets()
        task, nodes = self.build_task_dict(context, secrets)
        self.try_refs(context)  # the cluster name is valid
        hook = self.get_hook()
        handle = self.adopt_or_launch(hook, context, task, nodes)
        # An adopted launch keeps its first submission time: the deadline counts from there.
        wait = self.max_wait
        deadline = None if wait is None else (handle.submitted_at or time.time()) + wait.total_seconds()
        if self.deferrable:
            # DAG parse: the trigger loads the hook
            from npa_airflow.burst.triggers import BurstJobTrigger

            trigger = BurstJobTrigger(
                handle=handle.to_dict(),
                poll_interval=poll,
                deadline=deadline,
                stream_logs=self.stream_logs,
                cancel_on_kill=self.cancel_on_kill,
                nodes=nodes,
            )
            self.defer(trigger=trigger, method_name="execute_complete")
        return self.execute_complete(context, self._wait_here(hook, handle, poll, deadline, nodes))

    def _wait_here(
        self, hook: SkyPilotHook, handle: BurstJobHandle, poll: float, deadline: float | None, nodes: int
    ) -> dict[str, Any]:
        # DAG parse: watch loads the SkyPilot client
        from npa_airflow.burst.watch import watch_job

        def remember(current: BurstJobHandle) -> None:
            self._handle = current

        async def wait() -> dict[str, Any]:
            async with hook:
                return await watch_job(
                    hook,
                    handle,
                    poll_interval=poll,
                    deadline=deadline,
                    stream_logs=self.stream_logs,
                    log=self.log,
                    nodes=nodes,
                    on_job_id=remember,
                )

        return asyncio.run(wait())

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Turn the wait's event into the task's outcome (the Slurm side's: a program failure is not retried)."""
        # DAG parse: watch loads the SkyPilot client
        from npa_airflow.burst.watch import event_handle, validate_event

        event = validate_event(event)
        status, handle, message = event["status"], event_handle(event), str(event["message"])
        self._handle = handle
        context["ti"].xcom_push(key=xcom_keys.BURST_JOB, value=handle.to_dict())
        job = f"burst job {handle.name} on cluster {handle.cluster}"
        if status == "canceled" and handle.try_name not in (None, self.try_refs(context)[-1].try_name):
            # An adopted launch of an earlier try was cancelled: that try was cleared, which means "run again".
            self.log.warning("The adopted %s of an earlier try was cancelled (task cleared); launching anew", job)
            return self.execute(context)
        self._report_usage(context, event)  # before any outcome raises: a failed job used its GPUs too
        if status == "interrupted":  # the job's end is unknown: leave it and its cluster to the next try
            self._finished = True
            raise AirflowException(
                f"{job}: {message}. The job and its cluster were left as they are: the next try adopts them "
                f"(on_previous_try='reattach') or cancels them ('cancel'); to stop them by hand, run "
                f"`sky down {handle.cluster}` against {handle.endpoint}"
            )
        tail = self._log_tail(handle) if status == "failed" else ""  # read before the teardown takes it away
        # A deadline still has a live launch or job: cancel it; every ending applies the teardown policy.
        self._cancel_and_teardown(handle, cancel=status == "deadline")
        self._finished = True
        if status == "success":
            self.log.info("%s", message)
            return handle.to_dict()
        if status == "deadline":
            raise AirflowException(
                f"{job}: {message}; max_wait={self.max_wait} passed since the launch, so it was cancelled "
                f"(teardown={handle.teardown})"
            )
        if status == "canceled":
            raise AirflowFailException(f"{job} was cancelled outside Airflow ({message}); not retried")
        return self._fail(handle, event, message, tail)

    def _report_usage(self, context: Context, event: dict[str, Any]) -> None:
        """The job's GPU-hours to XCom `npa_usage` (None when unknown) and one line of the task log."""
        usage, unknown = event_usage(event)
        context["ti"].xcom_push(key=xcom_keys.USAGE, value=usage.to_dict() if usage else None)
        self.log.info("%s", usage_line(usage, unknown))

    def _fail(self, handle: BurstJobHandle, event: dict[str, Any], message: str, tail: str) -> Any:
        # DAG parse: outcome loads the SkyPilot client
        from npa_airflow.burst.outcome import classify_burst_failure

        verdict = classify_burst_failure(event.get("native_state"), message, tail)
        shown = f"\n--- last lines of the job's output ---\n{tail}" if tail else ""
        if verdict.is_infra:
            raise AirflowException(
                f"burst job {handle.name} failed for an infrastructure reason ({verdict.evidence}){shown}"
            )
        raise AirflowFailException(f"{message}: a program failure, not retried.{shown}")

    def _log_tail(self, handle: BurstJobHandle) -> str:
        # DAG parse: outcome loads the SkyPilot client
        from npa_airflow.burst.outcome import read_log_tail

        with self.get_hook() as hook:
            return read_log_tail(hook, handle, self.log)

    def _cancel_and_teardown(self, handle: BurstJobHandle, *, cancel: bool) -> None:
        with self.get_hook() as hook:
            hook.cancel_and_teardown(handle, self.log, cancel=cancel, teardown=True)

    def on_kill(self) -> None:
        """The worker is killing the task (non-deferrable wait, or before deferring): cancel and tear down."""
        handle = self._handle
        if handle is None or self._finished or not self.cancel_on_kill:
            return
        self._finished = True
        try:
            self._cancel_and_teardown(handle, cancel=True)
        except Exception:
            self.log.exception("Cancelling burst job %s failed", handle.to_json())
