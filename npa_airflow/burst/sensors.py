"""BurstJobSensor: wait for a burst job launched elsewhere (a handle from XCom, or its JSON)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.sensor import BaseSensorOperator

from npa_airflow.common.defaults import default_deferrable
from npa_airflow.common.links import BurstJobLink
from npa_airflow.exceptions import NpaError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.hook import SkyPilotHook


class BurstJobSensor(BaseSensorOperator):
    """Succeeds when the job of ``handle`` completes; fails when it fails or is cancelled.

    It only watches: it never cancels the job or tears its cluster down (that belongs to whoever launched it).

    :param handle: ``BurstJobHandle`` dict or JSON, e.g. ``"{{ ti.xcom_pull(task_ids='train', key='burst_job') }}"``.
    """

    template_fields: Sequence[str] = ("handle",)
    operator_extra_links = (BurstJobLink(),)

    def __init__(self, *, handle: Any, deferrable: bool | None = None, stream_logs: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.handle = handle
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.stream_logs = stream_logs

    def linked_job(self) -> dict[str, Any] | None:
        """The watched launch for the "SkyPilot cluster" link."""
        try:
            return self._handle().to_dict()
        except Exception:
            return None

    def _handle(self) -> BurstJobHandle:
        # DAG parse: the handle loads burst.task (run-time only)
        from npa_airflow.burst.handle import BurstJobHandle

        value = self.handle
        if isinstance(value, str) and value.strip().startswith("{") and "'" in value and '"' not in value:
            value = ast.literal_eval(value)  # a dict rendered with str() by Jinja
        return BurstJobHandle.from_dict(value)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # DAG parse: the trigger loads the hook
        from npa_airflow.burst.triggers import BurstJobTrigger

        handle = self._handle()
        deadline = None if self.timeout is None else handle.submitted_at or 0
        self.defer(
            trigger=BurstJobTrigger(
                handle=handle.to_dict(),
                poll_interval=float(self.poke_interval),
                deadline=(deadline + float(self.timeout)) if deadline else None,
                stream_logs=self.stream_logs,
                cancel_on_kill=False,
            ),
            method_name="execute_complete",
        )

    def poke(self, context: Context) -> bool:
        # DAG parse: the SkyPilot client and the hook (httpx)
        from npa_airflow.burst import client as sky
        from npa_airflow.burst.hook import SkyPilotHook

        handle = self._handle()
        with SkyPilotHook(handle.conn_id) as hook:
            job_id = handle.job_id if handle.job_id is not None else self._launched_job_id(hook, handle)
            if job_id is None:
                return False
            native = hook.job_status(handle.cluster, job_id)
        state = sky.interpret_job_state(native)
        self.log.info("SkyPilot job %s on %s: %s", job_id, handle.cluster, native)
        if not state.is_terminal:
            return False
        if state.is_success:
            return True
        raise NpaError(f"SkyPilot job {job_id} ({handle.name}) on cluster {handle.cluster} ended {native}")

    def _launched_job_id(self, hook: SkyPilotHook, handle: BurstJobHandle) -> int | None:
        """The job id the launch created; None while the launch runs (a failed launch raises)."""
        # DAG parse: the SkyPilot client (httpx)
        from npa_airflow.burst import client as sky

        launch = hook.launch_status(handle.request_id)
        if launch is None or not launch.finished:
            self.log.info("Launch request %s: %s", handle.request_id, launch and launch.status)
            return None
        result = hook.launch_result(handle.request_id)
        result.raise_for_error()
        job_id = sky.parse_launch_result(result.return_value)
        if job_id is None:
            raise NpaError(f"launch of cluster {handle.cluster} returned no job id")
        return job_id

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        # DAG parse: watch loads the SkyPilot client
        from npa_airflow.burst.watch import event_handle, validate_event

        event = validate_event(event)
        status, handle, message = event["status"], event_handle(event), str(event["message"])
        if status != "success":
            raise NpaError(f"burst job {handle.name}: {message}")
        self.log.info("%s", message)
        return handle.to_dict()
