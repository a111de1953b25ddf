"""The end of a Slurm job step: the wait's event turned into the task's outcome (`Completion`, made by the operator
for each event).

Success returns the handle; a segment of a long run that asked to be continued, or a job preempted without
requeue, returns a `NextSegment` (operators/segments.py) for the operator to submit; a wait that ended first
(deadline, a reason that never clears, a lost job) cancels and fails; a cancel by Airflow of an adopted job restarts
the try; a failure is classified: infrastructure (retried without its bad nodes) or program (not retried). Whatever
the outcome, the job's GPU-hours (the event's usage) go to
XCom `npa_usage` (a run's total over its segments) and one line of the task log before any failure is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.common import xcom_keys
from npa_airflow.common.naming import first_segment_name, segment_of
from npa_airflow.common.secret_masking import redact_text
from npa_airflow.common.usage import duration_text, event_usage, usage_line
from npa_airflow.slurm.operators.bad_nodes import forget_bad_nodes, record_bad_nodes
from npa_airflow.slurm.operators.job import fail_task
from npa_airflow.slurm.operators.outage import cluster_read
from npa_airflow.slurm.operators.outcome import classify_failure, read_log_tail
from npa_airflow.slurm.operators.segments import NextSegment, RunState, checkpoint_note, run_usage, segment_usage_entry
from npa_airflow.slurm.submit.layout import continue_file
from npa_airflow.slurm.triggers import event_handle, validate_event

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.cancel import Cancelling
    from npa_airflow.slurm.operators.job import ThisTry


CHILD_TIMEOUT_EXIT_CODE = 124  # the template's child timeout ended the command (timeout(1)'s code)
TIME_LIMIT_ADVICE = (
    " The job reached its time limit. To run longer than one job may, let the command checkpoint: "
    "checkpoint_signal='USR1@900' warns it 15 minutes before the limit, and with max_segments=N a command that then "
    'writes where it stopped to $NPA_CONTINUE_FILE and exits is continued in a new job (README, "Long runs").'
)


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
    :param run: a long run's earlier segments (their usage, the preemptions resubmitted).
    :param max_segments: how many segments the run may take (1: a job that asks to be continued fails).
    :param max_preemptions: how many preemptions without requeue are resubmitted in this try.
    """

    context: Context
    this_try: ThisTry
    log: logging.Logger
    cancelling: Cancelling
    _: KW_ONLY
    own_job_name: str
    mask_secrets: Callable[[], bool]
    restart: Callable[[], Any]
    run: RunState = field(default_factory=RunState)
    max_segments: int = 1
    max_preemptions: int = 0

    def outcome(self, event: dict[str, Any] | None) -> Any:
        """Turn the wait's event into the task's outcome: the handle's dict, a `NextSegment`, or an exception."""
        handle, status = self._accept_event(event)
        job = f"Slurm job {handle.job_id} ({handle.job_name})"
        if status == "success":
            self.this_try.done = True
            forget_bad_nodes(self.context, self.log)
            self.log.info("%s completed", job)
            self._report_usage(event, handle)
            return handle.to_dict()
        run = self._report_usage(event, handle)  # before any outcome raises: a failed job used its GPUs too
        hook = self.this_try.hook_for(handle)
        if status == "continue":
            return self._continued(hook, handle, event, run)
        if event.get("native_state") == "PREEMPTED" and run.preemptions < self.max_preemptions:
            return self._preempted(handle, event, run)
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

    def _report_usage(self, event: dict[str, Any], handle: SlurmJobHandle) -> RunState:
        """The job's GPU-hours, and the run's over its segments, to XCom `npa_usage` (None when unknown) and the
        task log; returns the run with this segment's entry."""
        usage, unknown = event_usage(event)
        entry = segment_usage_entry(segment_of(handle.job_name), handle.job_id, usage and usage.to_dict(), unknown)
        run = replace(
            self.run,
            usage=(*self.run.usage, entry),
            first_submitted_at=self.run.first_submitted_at or handle.submitted_at,
        )
        total = run_usage(run.usage)
        self.context["ti"].xcom_push(key=xcom_keys.USAGE, value=total)
        self.log.info("%s", usage_line(usage, unknown))
        if len(run.usage) > 1:
            hours = f"{total['gpu_hours']:.2f} GPU-hours" if total else "unknown"
            known = sum(1 for e in run.usage if "gpu_hours" in e)
            self.log.info("GPU usage of the run so far: %s (%d of %d segments known)", hours, known, len(run.usage))
        return run

    def _continued(self, hook: SlurmHook, handle: SlurmJobHandle, event: dict[str, Any], run: RunState) -> Any:
        """A segment ended with its continue file: the next segment, or a failure at `max_segments`."""
        segment = segment_of(handle.job_name)
        note = self._checkpoint_note(hook, handle)
        usage, _ = event_usage(event)
        after = f" after {duration_text(usage.elapsed_seconds)}" if usage else ""
        why = f"{event.get('native_state')}{_limit_reached(event)}{after}, checkpoint: {note}"
        continued = segment - run.preemptions  # preemptions resubmitted do not count against max_segments
        if continued >= self.max_segments:
            self.this_try.done = True
            raise AirflowFailException(
                f"Slurm job {handle.job_id} ({handle.job_name}), segment {segment}, asked to be continued ({why}), "
                f"but the run has used max_segments={self.max_segments}. Raise max_segments, or let each segment "
                "run longer (time_hours up to the partition's MaxTime); the checkpoints are in "
                f"{handle.results_dir}."
            )
        self.log.info("Segment %d of at most %d ended to be continued (%s)", segment, self.max_segments, why)
        return NextSegment(handle, run)

    def _checkpoint_note(self, hook: SlurmHook, handle: SlurmJobHandle) -> str:
        """The first line of the segment's continue file (where it stopped), as the command wrote it, masked."""
        path = continue_file(handle.results_dir)
        if not self.mask_secrets():
            return f"not read (the job's secret values could not be read to mask them; see {path})"
        try:
            chunks = cluster_read(self.log, "reading the continue file", hook.tail_logs, [(path, 0)], max_bytes=200)
        except Exception as exc:
            return f"not read ({exc})"
        note = redact_text(checkpoint_note(b"".join(c.data for c in chunks)))
        return note or "(the file is empty)"

    def _preempted(self, handle: SlurmJobHandle, event: dict[str, Any], run: RunState) -> NextSegment:
        """Preempted without requeue: resubmitted as the next segment, on its own budget (never the retries)."""
        run = replace(run, preemptions=run.preemptions + 1)
        self.log.warning(
            "Slurm job %s (%s) was preempted without requeue (%s): not the program's failure. Resubmitting it as "
            "the next segment (preemption %d of at most %d in this try; the task's retries are untouched); a "
            "command that checkpointed on the warning resumes from its checkpoint",
            *(handle.job_id, handle.job_name, event.get("native_state"), run.preemptions, self.max_preemptions),
        )
        return NextSegment(handle, run)

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
        adopted = first_segment_name(handle.job_name) != first_segment_name(self.own_job_name)
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
        advice = TIME_LIMIT_ADVICE if _limit_reached(event) else ""
        raise AirflowFailException(
            f"{event['message']}: a program failure, not retried.{advice}\n--- last lines of the job's output ---\n"
            f"{tail}"
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


def _limit_reached(event: dict[str, Any]) -> str:
    """ " (time limit)" or " (the child timeout)" when the job ran out of time, else ""."""
    if event.get("native_state") == "TIMEOUT":
        return " (time limit)"
    return " (the child timeout)" if event.get("exit_code") == CHILD_TIMEOUT_EXIT_CODE else ""
