"""The end of a Slurm job step: the wait's event turned into the task's outcome (`Completion`, made by the operator
for each event).

Success returns the handle; a wait that ended first (deadline, a reason that never clears, a lost job) cancels and
fails; a cancel by Airflow of an adopted job restarts the try; a failure is classified: infrastructure (retried
without its bad nodes) or program (not retried). Whatever the outcome, the job's GPU-hours (the event's usage) go to
XCom `npa_usage` and one line of the task log before any failure is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.common import xcom_keys
from npa_airflow.common.secret_masking import redact_text
from npa_airflow.slurm.operators.bad_nodes import forget_bad_nodes, record_bad_nodes
from npa_airflow.slurm.operators.job import fail_task
from npa_airflow.slurm.operators.outcome import classify_failure, read_log_tail
from npa_airflow.slurm.triggers import event_handle, validate_event
from npa_airflow.slurm.watch.trigger_events import event_usage, usage_line

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.cancel import Cancelling
    from npa_airflow.slurm.operators.job import ThisTry


@dataclass(eq=False, repr=False)
class Completion:
    """The outcome of one step's event (`outcome`).

    :param context: the task's context (the bad nodes live in its task state store).
    :param this_try: the try: its hook, and the handle and `done` set here.
    :param log: the task's logger.
    :param cancelling: cancels the job when the wait ended before it did; tells who cancelled it.
    :param own_job_name: the job this step itself submits (another name is an adopted earlier try's).
    :param mask_secrets: registers the job's secret values with this process's masker; False when it could not
        (the job's output is then not read here).
    :param restart: runs the try from its first step again (an adopted job that a clear cancelled).
    """

    context: Context
    this_try: ThisTry
    log: logging.Logger
    cancelling: Cancelling
    _: KW_ONLY
    own_job_name: str
    mask_secrets: Callable[[], bool]
    restart: Callable[[], Any]

    def outcome(self, event: dict[str, Any] | None) -> Any:
        """Turn the wait's event into the task's outcome: the handle's dict, or an exception."""
        handle, status = self._accept_event(event)
        job = f"Slurm job {handle.job_id} ({handle.job_name})"
        if status == "success":
            self.this_try.done = True
            forget_bad_nodes(self.context, self.log)
            self.log.info("%s completed", job)
            self._report_usage(event)
            return handle.to_dict()
        self._report_usage(event)  # before any outcome raises: a failed job used its GPUs too
        hook = self.this_try.hook_for(handle)
        if status in ("deadline", "unsatisfiable", "vanished"):
            self.this_try.done = True
            raise self._ended_by_the_wait(hook, handle, event, job)
        if status == "canceled":
            return self._after_cancel(hook, handle, event)
        self.this_try.done = True
        tail = self._failure_tail(hook, handle, event)
        if status == "marker_missing":
            raise AirflowFailException(f"{event['message']}\n--- last lines of the job's output ---\n{tail}")
        return self._fail_for_failed_job(hook, event, handle, tail)

    def _report_usage(self, event: dict[str, Any]) -> None:
        """The job's GPU-hours to XCom `npa_usage` (None when unknown) and one line of the task log."""
        usage, unknown = event_usage(event)
        self.context["ti"].xcom_push(key=xcom_keys.USAGE, value=usage.to_dict() if usage else None)
        self.log.info("%s", usage_line(usage, unknown))

    def _accept_event(self, event: Any) -> tuple[SlurmJobHandle, str]:
        try:
            event = validate_event(event)
        except ValueError as exc:
            raise AirflowException(f"Slurm wait ended with an unusable event: {exc}") from exc
        self.this_try.handle = event_handle(event)
        return self.this_try.handle, event["status"]

    def _ended_by_the_wait(self, hook: SlurmHook, handle: SlurmJobHandle, event: dict[str, Any], job: str) -> Exception:
        """The error for a wait that ended before the job did: its deadline passed, Slurm can never start it, or
        the cluster lost it. A job that could not be cancelled leaves the task retryable, so a retry tries again."""
        status = event["status"]
        if status == "vanished":
            return AirflowException(
                f"{event['message']}. A retry looks for the job by name and submits a new one if it is gone."
            )
        if status == "deadline":
            report = self.cancelling.cancel_job(hook, handle, "its deadline passed")
            return AirflowException(
                f"{job} did not finish before its deadline (max_wait / execution_timeout, counted from the job's "
                f"submission); {report.says}"
            )
        report = self.cancelling.cancel_job(hook, handle, f"Slurm says it can never start ({event.get('reason')})")
        message = (
            f"{event['message']}; {report.says}. Change the request (nodes, gpus_per_node, --mem, --constraint, "
            "partition, account/QOS) to what the cluster offers and run the task again."
        )
        return AirflowFailException(message) if report.done else AirflowException(message)

    def _after_cancel(self, hook: SlurmHook, handle: SlurmJobHandle, event: dict[str, Any]) -> Any:
        """The job was cancelled. Outside Airflow: fail, naming who. By Airflow, for a job this try had adopted
        from an earlier one: the user cleared that try (its trigger's on_kill cancels), which means "run again"."""
        adopted = handle.job_name != self.own_job_name
        whose = " of an earlier try" if adopted else ""
        self.cancelling.fail_unless_cancelled_by_airflow(
            hook, handle.job_id, handle.job_name, handle.script_path, whose
        )
        if adopted:
            self.log.warning(
                "Slurm job %s (%s) of an earlier try was cancelled by Airflow (the task was cleared); submitting "
                "a new job",
                handle.job_id,
                handle.job_name,
            )
            return self.restart()
        self.this_try.done = True
        raise fail_task(
            f"Slurm job {handle.job_id} ({handle.job_name}) was cancelled by Airflow while this try waited for it "
            f"({event.get('native_state')}): another try or a kill of the task cancelled it"
        )

    def _fail_for_failed_job(self, hook: SlurmHook, event: dict[str, Any], handle: SlurmJobHandle, tail: str) -> Any:
        """A FAILED job: an infrastructure failure is retried without the bad nodes; a program failure is not."""
        verdict = classify_failure(event, handle.job_name, tail)
        if verdict.kind == "infra":
            excluded = record_bad_nodes(self.context, hook, verdict.bad_nodes, self.log)
            where = f"; the next try excludes {', '.join(excluded)}" if excluded else ""
            raise AirflowException(
                f"Slurm job {handle.job_id} ({handle.job_name}) failed for an infrastructure reason "
                f"({verdict.evidence}){where}. --- last lines of the job's output ---\n{tail}"
            )
        raise AirflowFailException(
            f"{event['message']}: a program failure, not retried.\n--- last lines of the job's output ---\n{tail}"
        )

    def _failure_tail(self, hook: SlurmHook, handle: SlurmJobHandle, event: dict[str, Any]) -> str:
        """The end of the job's output for the failure message, every secret value masked.

        Read from the cluster when this process could register the secrets, else the event's tail (which the
        trigger masked as it wrote it).
        """
        tail = ""
        if self.mask_secrets():
            try:
                tail = read_log_tail(hook, handle)
            except Exception as exc:
                self.log.warning("Could not read the end of the job's log: %s", exc)
        return redact_text(tail or event.get("log_tail") or "")
