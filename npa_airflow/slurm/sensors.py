"""SlurmJobSensor: wait for a Slurm job submitted elsewhere (another task, or by hand)."""

from __future__ import annotations

import ast
import json
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.sensor import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.common.defaults import default_deferrable
from npa_airflow.common.links import SlurmJobLink
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.handle import JOB_ID_RE, SlurmJobHandle

if TYPE_CHECKING:
    from airflow.sdk import Context

_SAFE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def parse_job_reference(job: Any) -> dict[str, Any] | str:
    """A handle dict (also as JSON or a rendered dict literal), or a bare Slurm job id string.

    The sensor only watches: a handle's secret sidecar and script (whose marker a cancel writes) are its submitter's
    to remove, and are dropped here, so a handle read from XCom never makes the sensor delete or write a file."""
    if isinstance(job, int) and not isinstance(job, bool):
        job = str(job)
    if isinstance(job, str):
        text = job.strip()
        if JOB_ID_RE.fullmatch(text):
            return text
        if text.startswith("{"):
            try:
                job = json.loads(text)
            except ValueError:
                try:
                    job = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    pass
    if isinstance(job, dict):
        watched = replace(SlurmJobHandle.from_dict(job), env_file=None, script_path=None)
        return watched.to_dict()
    raise NpaValidationError(
        f"job={job!r} is neither a Slurm job id (e.g. '12345', '12345_7', '12345+0') nor a job handle; pass "
        "\"{{ ti.xcom_pull(task_ids='submit', key='slurm_job') }}\" or a job id"
    )


class SlurmJobSensor(BaseSensorOperator):
    """Wait until a Slurm job ends; succeed if it COMPLETED (and its success marker exists, if asked).

    :param job: a job handle (XCom `slurm_job` of a submit task) or a bare job id. Templated.
    :param slurm_conn_id: the Slurm connection.
    :param deferrable: wait in the triggerer (default) rather than poking from a worker.
    :param success_marker: also require this file (relative to the handle's results dir, or absolute).
    :param stream_logs: copy the job's output into this task's log (needs a handle, not a bare id).
    """

    template_fields: Sequence[str] = ("job",)
    operator_extra_links = (SlurmJobLink(),)

    def __init__(
        self,
        *,
        job: Any,
        slurm_conn_id: str = "slurm_default",
        deferrable: bool | None = None,
        success_marker: str | None = None,
        stream_logs: bool = False,
        poke_interval: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job = job
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.success_marker = success_marker
        self.stream_logs = stream_logs

    def _hook(self, cluster: str | None = None) -> Any:
        """A hook for the job's cluster (a handle's "cluster"; None: the connection's)."""
        # DAG parse: the hook loads asyncssh
        from npa_airflow.slurm.hook import SlurmHook

        return SlurmHook(self.slurm_conn_id, cluster=cluster)

    def linked_job(self) -> dict[str, Any] | None:
        """The watched job for the "Slurm job" link (no remote call: a bare id links by its id)."""
        try:
            ref = parse_job_reference(self.job)
        except Exception:
            return None
        return ref if isinstance(ref, dict) else {"conn_id": self.slurm_conn_id, "cluster": None, "job_id": ref}

    def _handle(self) -> dict[str, Any]:
        ref = parse_job_reference(self.job)
        if isinstance(ref, dict):
            return ref
        # A bare id: a minimal handle (no log paths to stream, no results dir).
        infos = self._hook().job_states([ref])
        name = infos[ref].job_name if ref in infos else None
        return {
            "conn_id": self.slurm_conn_id,
            "cluster": None,
            "job_id": ref,
            "job_name": name if name and _SAFE_NAME_RE.fullmatch(name) else f"slurm-job-{ref}",
            "login_host": "unknown",
            "results_dir": "/",
            "stdout_path": "/dev/null",
            "stderr_path": "/dev/null",
            "try_number": 1,
            "retry_of": None,
            "submitted_at": None,
        }

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # DAG parse: the trigger loads the poller and the hook (asyncssh)
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        handle = self._handle()
        is_bare = handle["stdout_path"] == "/dev/null"
        deadline = time.time() + self.timeout if self.timeout else None
        trigger = SlurmJobTrigger(
            handle=handle,
            conn_id=self.slurm_conn_id,
            poll_interval=self.poke_interval,
            deadline=deadline,
            require_marker=self.success_marker,
            stream_logs=self.stream_logs and not is_bare,
            cancel_on_kill=False,  # the job belongs to whoever submitted it
        )
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout + 600) if self.timeout else None,
        )

    def poke(self, context: Context) -> bool:
        ref = parse_job_reference(self.job)
        job_id = ref["job_id"] if isinstance(ref, dict) else ref
        hook = self._hook(ref.get("cluster") if isinstance(ref, dict) else None)
        info = hook.job_states([job_id]).get(job_id)
        if info is None or not info.state.is_terminal:
            self.log.info("Slurm job %s: %s", job_id, info.native_state if info else "not visible yet")
            return False
        self._finish(job_id, info.state.value, info.native_state)
        if self.success_marker and isinstance(ref, dict):
            marker = self.success_marker
            if not marker.startswith("/"):
                marker = f"{ref['results_dir'].rstrip('/')}/{marker}"
            if not hook.path_exists(marker):
                raise AirflowFailException(f"Slurm job {job_id} COMPLETED but its success marker {marker} is missing")
        return True

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        # DAG parse: the trigger module loads the poller and the hook
        from npa_airflow.slurm.triggers import validate_event

        try:
            event = validate_event(event)
        except ValueError as exc:
            raise AirflowException(f"Slurm sensor got an unusable event: {exc}") from exc
        status = event["status"]
        if status == "success":
            return event["handle"]
        if status == "deadline":
            raise AirflowException(f"Slurm job {event['job_id']} did not end before the sensor's timeout")
        raise AirflowFailException(f"{event['message']}\n{event.get('log_tail') or ''}".rstrip())

    def _finish(self, job_id: str, state: str, native: str) -> None:
        if state != "COMPLETE":
            raise AirflowFailException(f"Slurm job {job_id} ended {native}")
