"""Cancelling a task's Slurm job: retried while the cluster does not answer, reported as what really happened,
and done even when the task is killed while sbatch, or the reconciliation of an ambiguous submission, is still
in flight. Mixed into `SlurmJobOperatorBase` (with the cluster calls that ride out a short outage).

Every cancel creates Airflow's cancel marker of the job first (`cancels.cancel_marker_of`). A job found
cancelled without it was cancelled outside Airflow: the task fails naming who, and writes the marker then, so
that clearing the task runs it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from npa_airflow.common.retry import Backoff, Budget, retry
from npa_airflow.exceptions import cluster_did_not_answer
from npa_airflow.slurm.cancels import CancelRequest, cancel_marker_of

if TYPE_CHECKING:
    from npa_airflow.slurm.commands import CancelOrigin
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.job import PreparedJob

OUTAGE_RETRY_SECONDS = 90.0  # cluster calls of a running task ride out a short slurmctld/sshd outage
OUTAGE_BACKOFF = Backoff(base=2.0, cap=15.0, jitter=0.5)
# Airflow's supervisor sends SIGKILL 5 s after the SIGTERM whose handler calls on_kill: cancel within that.
ON_KILL_SECONDS = 4.0
ON_KILL_BACKOFF = Backoff(base=0.5, cap=2.0, jitter=0.5)
T = TypeVar("T")


class CancelReport(NamedTuple):
    """How a cancel went: `done` when the job is cancelled or had ended; `says` completes the task's message."""

    done: bool
    says: str


class JobCancelMixin:
    """The cancel half of the job lifecycle (the operator supplies the attributes declared here)."""

    log: logging.Logger
    cancel_on_kill: bool
    get_hook: Callable[[], SlurmHook]
    job_hook: Callable[[SlurmJobHandle], SlurmHook]
    _handle: SlurmJobHandle | None
    _in_flight: PreparedJob | None  # this step's own job while it is submitted or reconciled (no id yet)
    _killed: bool
    _done: bool

    # -- cluster calls that ride out a short outage -------------------------------------------------------

    def _through_outage(
        self, what: str, call: Callable[[], T], *, seconds: float | None = None, backoff: Backoff = OUTAGE_BACKOFF
    ) -> T:
        """Retry `call` while the cluster does not answer, with jittered backoff, for `seconds`
        (default OUTAGE_RETRY_SECONDS)."""
        return retry(
            call,
            transient=cluster_did_not_answer,
            backoff=backoff,
            budget=Budget(seconds=OUTAGE_RETRY_SECONDS if seconds is None else seconds),
            on_retry=lambda exc, delay: self.log.warning("%s failed (%s); retrying in %.0f s", what, exc, delay),
        )

    def cluster_read(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a read-only hook call through a short outage (better than burning a retry)."""
        return self._through_outage(what, lambda: call(*args, **kwargs))

    def cancel_through_outage(self, hook: SlurmHook, request: CancelRequest, what: str) -> str:
        """scancel the job of `request` (recording that Airflow did), riding out a short outage; raises when it
        could not."""
        return self._through_outage(what, lambda: hook.cancel_one(request))

    # -- cancel the job of a handle -----------------------------------------------------------------------

    def _cancel_job(self, hook: SlurmHook, handle: SlurmJobHandle, why: str, *, killed: bool = False) -> CancelReport:
        """scancel the job, retrying while the cluster does not answer (for ON_KILL_SECONDS when the task is being
        killed); a failure is logged as an error, never as a cancel, and the report says so."""
        request = CancelRequest.for_handle(handle)
        try:
            outcome = self._through_outage(
                f"cancelling Slurm job {handle.job_id}",
                lambda: hook.cancel_one(request),
                seconds=ON_KILL_SECONDS if killed else None,
                backoff=ON_KILL_BACKOFF if killed else OUTAGE_BACKOFF,
            )
        except Exception as exc:
            self.log.error("Could not cancel Slurm job %s (%s): %s", handle.job_id, why, exc)
            return CancelReport(
                False, f"it could NOT be cancelled ({exc}) and may still run: cancel it with `scancel {handle.job_id}`"
            )
        if outcome == "ended":
            self.log.info("Slurm job %s had already ended: nothing to cancel (%s)", handle.job_id, why)
            return CancelReport(True, "it had already ended")
        self.log.info("Cancelled Slurm job %s (%s)", handle.job_id, why)
        return CancelReport(True, "it was cancelled")

    # -- the task is killed -------------------------------------------------------------------------------

    def on_kill(self) -> None:
        """Airflow is killing the task (its SIGTERM handler calls this; SIGKILL follows 5 s later): cancel the job.

        By id once the job is known. While sbatch, or the reconciliation of an ambiguous submission, is still
        in flight, by this try's exact job name (no other try's or task's job has it), after creating the cancel
        marker that makes an sbatch still running on the login host cancel its own job when it returns. The
        interrupted submission then stops where it resumes (`stop_if_killed`).
        """
        if self._done or not self.cancel_on_kill:
            return
        self._killed = True
        if self._handle is not None:
            self._cancel_job(self.job_hook(self._handle), self._handle, "the task was killed", killed=True)
        elif self._in_flight is not None:
            self._cancel_in_flight(self.get_hook(), self._in_flight)

    def _cancel_in_flight(self, hook: SlurmHook, job: PreparedJob) -> None:
        name = job.job_name
        shred = job.secret_files
        if job.owner_comment is None:  # only a job this try submits is cancelled by name
            return
        comment = job.owner_comment
        try:
            self._through_outage(
                f"cancelling Slurm jobs named {name}",
                lambda: hook.cancel_by_name(
                    name, comment=comment, marker=cancel_marker_of(job.script_path), shred=shred
                ),
                seconds=ON_KILL_SECONDS,
                backoff=ON_KILL_BACKOFF,
            )
        except Exception as exc:
            self.log.error("Could not cancel Slurm job %s, being submitted when the task was killed: %s", name, exc)
            return
        self.log.info(
            "The task was killed while Slurm job %s was being submitted: cancelled any job of that name, and an "
            "sbatch still running on the login host cancels its job when it returns",
            name,
        )

    def stop_if_killed(self, hook: SlurmHook, handle: SlurmJobHandle | None = None) -> None:
        """Where a submission resumes after on_kill: cancel the job it got (if any) and end the task."""
        if not self._killed:
            return
        from airflow.sdk.exceptions import AirflowException

        self._done = True
        says = ""
        if handle is not None:
            says = "; " + self._cancel_job(self.job_hook(handle), handle, "the task was killed", killed=True).says
        raise AirflowException(f"the task was killed while its Slurm job was being submitted{says}")

    # -- who cancelled ------------------------------------------------------------------------------------

    def fail_unless_cancelled_by_airflow(
        self, hook: SlurmHook, job_id: str, job_name: str, script_path: str | None, whose: str = ""
    ) -> None:
        """A job cancelled outside Airflow fails the task (not retried), naming who; Airflow's own cancels pass.

        Once reported, the cancel is recorded as known to Airflow (its marker), so clearing the task runs it
        again instead of failing on the same cancel.
        """
        from airflow.sdk.exceptions import AirflowException

        from npa_airflow.slurm.operators.job import fail_task

        job = f"Slurm job {job_id} ({job_name}){whose}"
        try:
            origin: CancelOrigin = self.cluster_read(
                "reading who cancelled", hook.cancel_origin, job_id, cancel_marker_of(script_path)
            )
        except Exception as exc:
            raise AirflowException(f"{job} was cancelled, and who cancelled it could not be read: {exc}") from exc
        if origin.by_airflow:
            return
        marker = cancel_marker_of(script_path)
        if marker is not None:
            from npa_airflow.slurm.commands import build_record_cancel

            try:
                hook.run(build_record_cancel(marker), check=False)
            except Exception as exc:
                self.log.warning("Could not record that the cancel of %s was reported: %s", job, exc)
        self._done = True
        raise fail_task(
            f"{job} was cancelled {origin.describe()}; it is not submitted again. Clear the task to run it anew."
        )
