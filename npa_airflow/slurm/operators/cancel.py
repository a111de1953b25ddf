"""Cancelling a try's Slurm jobs: retried while the cluster does not answer, reported as what really happened,
and done even when the task is killed while sbatch, or the reconciliation of an ambiguous submission, is still
in flight (`Cancelling`, one per try's step, over the try's `ThisTry`).

Every cancel creates Airflow's cancel marker of the job first (`cancels.cancel_marker_of`). A job found
cancelled without it was cancelled outside Airflow: the task fails naming who, and writes the marker then, so
that clearing the task runs it again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

from airflow.sdk.exceptions import AirflowException

from npa_airflow.slurm.commands import build_record_cancel
from npa_airflow.slurm.operators import outage
from npa_airflow.slurm.operators.job import fail_task, on_job_cluster
from npa_airflow.slurm.transport.cancels import CancelRequest, cancel_marker_of

if TYPE_CHECKING:
    from npa_airflow.slurm.commands import CancelOrigin
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.job import PreparedJob, ThisTry


class CancelReport(NamedTuple):
    """How a cancel went: `done` when the job is cancelled or had ended; `says` completes the task's message."""

    done: bool
    says: str


class Cancelling:
    """Cancels the jobs of one try: by a handle, by a request (an earlier try's job, a duplicate), or by this
    step's own name while its id is not known; and stops a submission the task was killed during.

    :param this_try: the try's state: whether it was killed (`killed`) and whether its outcome is decided (`done`,
        set here when a cancel ends the task).
    :param log: the task's logger.
    """

    def __init__(self, this_try: ThisTry, log: logging.Logger) -> None:
        self.this_try = this_try
        self.log = log

    def cancel(self, hook: SlurmHook, request: CancelRequest, what: str) -> str:
        """scancel the job of `request` (recording that Airflow did), riding out a short outage; raises when it
        could not."""
        return outage.through_outage(self.log, what, lambda: hook.cancel_one(request))

    def cancel_job(self, hook: SlurmHook, handle: SlurmJobHandle, why: str, *, killed: bool = False) -> CancelReport:
        """scancel the job, retrying while the cluster does not answer (for ON_KILL_SECONDS when the task is being
        killed); a failure is logged as an error, never as a cancel, and the report says so."""
        request = CancelRequest.for_handle(handle)
        try:
            result = outage.through_outage(
                self.log,
                f"cancelling Slurm job {handle.job_id}",
                lambda: hook.cancel_one(request),
                seconds=outage.ON_KILL_SECONDS if killed else None,
                backoff=outage.ON_KILL_BACKOFF if killed else outage.OUTAGE_BACKOFF,
            )
        except Exception as exc:
            self.log.error("Could not cancel Slurm job %s (%s): %s", handle.job_id, why, exc)
            return CancelReport(
                False, f"it could NOT be cancelled ({exc}) and may still run: cancel it with `scancel {handle.job_id}`"
            )
        if result == "ended":
            self.log.info("Slurm job %s had already ended: nothing to cancel (%s)", handle.job_id, why)
            return CancelReport(True, "it had already ended")
        self.log.info("Cancelled Slurm job %s (%s)", handle.job_id, why)
        return CancelReport(True, "it was cancelled")

    def cancel_in_flight(self, hook: SlurmHook, job: PreparedJob) -> None:
        """The task is killed while `job` (this step's own) is submitted or reconciled: cancel it by its exact name,
        after the cancel marker that makes an sbatch still running on the login host cancel its job on return."""
        name = job.job_name
        if job.owner_comment is None:  # only a job this try submits is cancelled by name
            return
        comment, marker = job.owner_comment, cancel_marker_of(job.script_path)
        try:
            outage.through_outage(
                self.log,
                f"cancelling Slurm jobs named {name}",
                lambda: hook.cancel_by_name(name, comment=comment, marker=marker, shred=job.secret_files),
                seconds=outage.ON_KILL_SECONDS,
                backoff=outage.ON_KILL_BACKOFF,
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
        if not self.this_try.killed:
            return

        self.this_try.done = True
        says = ""
        if handle is not None:
            report = self.cancel_job(on_job_cluster(hook, handle), handle, "the task was killed", killed=True)
            says = "; " + report.says
        raise AirflowException(f"the task was killed while its Slurm job was being submitted{says}")

    def fail_unless_cancelled_by_airflow(
        self, hook: SlurmHook, job_id: str, job_name: str, script_path: str | None, whose: str = ""
    ) -> None:
        """A job cancelled outside Airflow fails the task (not retried), naming who; Airflow's own cancels pass.

        Once reported, the cancel is recorded as known to Airflow (its marker), so clearing the task runs it
        again instead of failing on the same cancel.
        """
        job = f"Slurm job {job_id} ({job_name}){whose}"
        marker = cancel_marker_of(script_path)
        try:
            origin: CancelOrigin = outage.cluster_read(
                self.log, "reading who cancelled", hook.cancel_origin, job_id, marker
            )
        except Exception as exc:
            raise AirflowException(f"{job} was cancelled, and who cancelled it could not be read: {exc}") from exc
        if origin.by_airflow:
            return
        if marker is not None:
            try:
                hook.run(build_record_cancel(marker), check=False)
            except Exception as exc:
                self.log.warning("Could not record that the cancel of %s was reported: %s", job, exc)
        self.this_try.done = True
        raise fail_task(
            f"{job} was cancelled {origin.describe()}; it is not submitted again. Clear the task to run it anew."
        )
