"""The end of a Slurm job step: the wait's event turned into the task's outcome. Mixed into `SlurmJobOperatorBase`.

Success returns the handle; a wait that ended first (deadline, a reason that never clears, a lost job) cancels and
fails; a cancel by Airflow of an adopted job restarts the try; a failure is classified: infrastructure (retried
without its bad nodes) or program (not retried).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.cancel import CancelReport


class JobCompletionMixin:
    """The completion half of the job lifecycle (the operator supplies the attributes declared here)."""

    log: logging.Logger
    _handle: SlurmJobHandle | None
    _done: bool
    execute: Callable[[Context], Any]
    job_name_for_context: Callable[[Context], str]
    job_hook: Callable[[SlurmJobHandle], SlurmHook]
    _cancel_job: Callable[..., CancelReport]
    fail_unless_cancelled_by_airflow: Callable[..., None]
    _failure_tail: Callable[[SlurmHook, SlurmJobHandle, dict[str, Any]], str]
    _record_bad_nodes: Callable[[Context, SlurmHook, Sequence[str]], list[str]]

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """The job of `execute` ended (or its wait did): succeed, fail, or fail for a retry."""
        return self.complete_job(context, event, own_job_name=self.job_name_for_context(context))

    def complete_job(self, context: Context, event: dict[str, Any] | None, *, own_job_name: str) -> Any:
        """Turn the wait's event into the task's outcome; `own_job_name` is the job this step itself submits."""
        from airflow.sdk.exceptions import AirflowFailException

        from npa_airflow.slurm.operators.bad_nodes import forget_bad_nodes

        handle, status = self._accept_event(event)
        job = f"Slurm job {handle.job_id} ({handle.job_name})"
        if status == "success":
            self._done = True
            forget_bad_nodes(context, self.log)
            self.log.info("%s completed", job)
            return handle.to_dict()
        hook = self.job_hook(handle)
        if status in ("deadline", "unsatisfiable", "vanished"):
            self._done = True
            raise self._ended_by_the_wait(hook, handle, event, job)
        if status == "canceled":
            return self._after_cancel(context, hook, handle, event, own_job_name)
        self._done = True
        tail = self._failure_tail(hook, handle, event)
        if status == "marker_missing":
            raise AirflowFailException(f"{event['message']}\n--- last lines of the job's output ---\n{tail}")
        return self._fail_for_failed_job(context, hook, event, handle, tail)

    def _ended_by_the_wait(self, hook: SlurmHook, handle: SlurmJobHandle, event: dict[str, Any], job: str) -> Exception:
        """The error for a wait that ended before the job did: its deadline passed, Slurm can never start it, or
        the cluster lost it. A job that could not be cancelled leaves the task retryable, so a retry tries again."""
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        status = event["status"]
        if status == "vanished":
            return AirflowException(
                f"{event['message']}. A retry looks for the job by name and submits a new one if it is gone."
            )
        if status == "deadline":
            report = self._cancel_job(hook, handle, "its deadline passed")
            return AirflowException(
                f"{job} did not finish before its deadline (max_wait / execution_timeout, counted from the job's "
                f"submission); {report.says}"
            )
        report = self._cancel_job(hook, handle, f"Slurm says it can never start ({event.get('reason')})")
        message = (
            f"{event['message']}; {report.says}. Change the request (nodes, gpus_per_node, --mem, --constraint, "
            "partition, account/QOS) to what the cluster offers and run the task again."
        )
        return AirflowFailException(message) if report.done else AirflowException(message)

    def _after_cancel(
        self, context: Context, hook: SlurmHook, handle: SlurmJobHandle, event: dict[str, Any], own_job_name: str
    ) -> Any:
        """The job was cancelled. Outside Airflow: fail, naming who. By Airflow, for a job this try had adopted
        from an earlier one: the user cleared that try (its trigger's on_kill cancels), which means "run again"."""
        from npa_airflow.slurm.operators.job import fail_task

        adopted = handle.job_name != own_job_name
        whose = " of an earlier try" if adopted else ""
        self.fail_unless_cancelled_by_airflow(hook, handle.job_id, handle.job_name, handle.script_path, whose)
        if adopted:
            self.log.warning(
                "Slurm job %s (%s) of an earlier try was cancelled by Airflow (the task was cleared); submitting "
                "a new job",
                handle.job_id,
                handle.job_name,
            )
            return self.restart_after_clear(context)
        self._done = True
        raise fail_task(
            f"Slurm job {handle.job_id} ({handle.job_name}) was cancelled by Airflow while this try waited for it "
            f"({event.get('native_state')}): another try or a kill of the task cancelled it"
        )

    def restart_after_clear(self, context: Context) -> Any:
        """Run this try from its first step again, as if it had just started (its own job, not an adopted one)."""
        return self.execute(context)

    def _accept_event(self, event: Any) -> tuple[SlurmJobHandle, str]:
        from airflow.sdk.exceptions import AirflowException

        from npa_airflow.slurm.triggers import event_handle, validate_event

        try:
            event = validate_event(event)
        except ValueError as exc:
            raise AirflowException(f"Slurm wait ended with an unusable event: {exc}") from exc
        self._handle = event_handle(event)
        return self._handle, event["status"]

    def _fail_for_failed_job(
        self, context: Context, hook: SlurmHook, event: dict[str, Any], handle: SlurmJobHandle, tail: str
    ) -> Any:
        """A FAILED job: an infrastructure failure is retried without the bad nodes; a program failure is not."""
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from npa_airflow.slurm.operators.outcome import classify_failure

        verdict = classify_failure(event, handle.job_name, tail)
        if verdict.kind == "infra":
            excluded = self._record_bad_nodes(context, hook, verdict.bad_nodes)
            where = f"; the next try excludes {', '.join(excluded)}" if excluded else ""
            raise AirflowException(
                f"Slurm job {handle.job_id} ({handle.job_name}) failed for an infrastructure reason "
                f"({verdict.evidence}){where}. --- last lines of the job's output ---\n{tail}"
            )
        raise AirflowFailException(
            f"{event['message']}: a program failure, not retried.\n--- last lines of the job's output ---\n{tail}"
        )

    def _log_tail(self, hook: SlurmHook, handle: SlurmJobHandle) -> str:
        from npa_airflow.slurm.operators.outcome import read_log_tail

        try:
            return read_log_tail(hook, handle)
        except Exception as exc:
            self.log.warning("Could not read the end of the job's log: %s", exc)
            return ""
