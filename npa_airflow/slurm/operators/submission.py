"""Getting exactly one job for a step: adopt this try's or an earlier try's job, or submit a new one, and
reconcile an ambiguous submission by exact job name. Mixed into `SlurmJobOperatorBase`.

An adopted job keeps Slurm's own submit time in its handle, so `max_wait` counts from the first submission
across reattaches. An earlier try's job that was cancelled outside Airflow is never silently replaced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npa_airflow.common.retry import pause
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaValidationError
from npa_airflow.slurm.cancels import CancelRequest
from npa_airflow.slurm.job_owners import TryNames, describe_foreign, sort_by_owner
from npa_airflow.slurm.operators.job import PreparedJob, handle_for

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.common.deployment import Deployment
    from npa_airflow.slurm.commands import SlurmJobInfo
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook

RECONCILE_WINDOW_SECONDS = 45.0  # sacct can lag a few seconds behind sbatch
RECONCILE_POLL_SECONDS = 3.0


class AdoptOrSubmitMixin:
    """The submission half of the job lifecycle (the operator supplies the attributes declared here)."""

    log: logging.Logger
    slurm_conn_id: str
    on_previous_try: str
    _prepare_named: Callable[[str], PreparedJob] | None
    ti_identity: Callable[[Context], tuple[str, str, str, int | None, int]]
    deployment: Callable[[], Deployment]
    cluster_read: Callable[..., Any]
    cancel_through_outage: Callable[..., str]
    stop_if_killed: Callable[..., None]
    fail_unless_cancelled_by_airflow: Callable[..., None]

    def _adopt_or_submit(self, context: Context, hook: SlurmHook, job: PreparedJob) -> SlurmJobHandle:
        names = self._try_names(context, job.job_name)
        found = self._owned(self.cluster_read("looking up earlier tries", hook.find_jobs_by_name, names.all), names)
        try_number = self.ti_identity(context)[4]

        mine = [j for j in found if j.job_name == job.job_name]
        if mine:  # this very try already submitted (the worker died after sbatch and came back)
            return self._adopt_single(
                hook, job, mine, try_number, "this try's job, submitted before the worker restarted"
            )

        def by_try(j: SlurmJobInfo) -> int:
            return names.try_of(j.job_name)

        live = sorted((j for j in found if not j.state.is_terminal), key=by_try)
        previous = sorted(found, key=by_try)
        if self.on_previous_try == "reattach":
            if live:
                return self._reattach(hook, job, live, by_try)
            if previous and previous[-1].state is JobState.CANCELED:  # it would have been adopted: whose cancel?
                last = previous[-1]
                whose = " of an earlier try"
                script = self._prepared_for(job, last.job_name).script_path
                self.fail_unless_cancelled_by_airflow(hook, last.job_id, last.job_name or "", script, whose)
        if live and job.required_paths:  # never cancel a running job for a submission that cannot happen
            self._require_inputs(hook, job, live[-1])
        for j in live:
            self.log.info(
                "Cancelling Slurm job %s (%s) of an earlier try (on_previous_try='cancel')", j.job_id, j.job_name
            )
            earlier = self._prepared_for(job, j.job_name)
            request = CancelRequest.for_job(
                j.job_id, j.job_name, script_path=earlier.script_path, shred=earlier.secret_files
            )
            self.cancel_through_outage(hook, request, "cancelling an earlier try")

        retry_of = previous[-1].job_id if previous else None
        return self._submit(hook, job, try_number, retry_of)

    def _try_names(self, context: Context, own: str) -> TryNames:
        """`own` (this step's job name) and the names of this task instance's earlier tries, both namings."""
        from npa_airflow.common.naming import earlier_try_names, legacy_earlier_try_names

        identity = self.ti_identity(context)
        earlier = earlier_try_names(*identity, deployment=self.deployment())
        return TryNames(own, tuple(earlier), tuple(legacy_earlier_try_names(*identity)))

    def _owned(self, found: list[SlurmJobInfo], names: TryNames) -> list[SlurmJobInfo]:
        """The found jobs this task instance owns; the others holding its names are reported and left alone."""
        owners = sort_by_owner(found, names, self.deployment())
        for info in owners.foreign:
            self.log.warning(
                "%s has this task's job name but is not this task instance's job (another deployment sharing this "
                "cluster account, or a job made by hand): not adopting or cancelling it",
                describe_foreign(info),
            )
        return list(owners.owned)

    def _prepared_for(self, job: PreparedJob, name: str | None) -> PreparedJob:
        """The job named `name` as its try prepared it (its script and sidecar paths), or `job` itself."""
        if not name or name == job.job_name or self._prepare_named is None:
            return job
        return self._prepare_named(name)

    def _submit_time(self, hook: SlurmHook, job_id: str, known: float | None = None) -> float | None:
        """Slurm's submit time of an adopted job (`known`: the lookup read it): max_wait counts from there."""
        if known is not None:
            return known
        try:
            return self.cluster_read("reading the job's submit time", hook.submit_time, job_id)
        except Exception as exc:
            self.log.warning("Could not read when Slurm job %s was submitted (%s); counting from now", job_id, exc)
            return None

    def _reattach(
        self, hook: SlurmHook, job: PreparedJob, live: list[SlurmJobInfo], try_of: Callable[[SlurmJobInfo], int]
    ) -> SlurmJobHandle:
        """Adopt the newest live job of an earlier try; cancel any older live duplicates."""
        keep = live[-1]
        for extra in live[:-1]:
            self.log.warning("Cancelling duplicate live job %s (%s) of an earlier try", extra.job_id, extra.job_name)
            duplicate = self._prepared_for(job, extra.job_name)
            # A duplicate of the same name shares the kept job's sidecar: that one stays.
            shred = duplicate.secret_files if extra.job_name != keep.job_name else ()
            request = CancelRequest.for_job(
                extra.job_id, extra.job_name, script_path=duplicate.script_path, shred=shred
            )
            self.cancel_through_outage(hook, request, "cancelling a duplicate")
        self.log.info(
            "Reattaching to Slurm job %s (%s) of an earlier try instead of submitting a new one",
            keep.job_id,
            keep.job_name,
        )
        name = keep.job_name or job.job_name
        old = self._prepare_named(name) if self._prepare_named is not None else job
        submitted = self._submit_time(hook, keep.job_id, keep.submitted_at)
        return self._handle_of(hook, old, keep.job_id, try_number=try_of(keep), retry_of=None, submitted_at=submitted)

    def _require_inputs(self, hook: SlurmHook, job: PreparedJob, running: SlurmJobInfo) -> None:
        exists = self.cluster_read("checking inputs", hook.paths_exist, list(job.required_paths))
        missing = [p for p, ok in exists.items() if not ok]
        if missing:
            raise NpaValidationError(
                f"required inputs do not exist on the cluster: {', '.join(missing)}; the earlier try's job "
                f"{running.job_id} was left running. Stage the data on shared storage first."
            )

    def _submit(self, hook: SlurmHook, job: PreparedJob, try_number: int, retry_of: str | None) -> SlurmJobHandle:
        for attempt in (1, 2):
            self.stop_if_killed(hook)
            try:
                result = hook.stage_and_submit(
                    [*job.files, self._script_file(job)],
                    job.script_path,
                    sbatch_args=list(job.sbatch_args),
                    required_paths=list(job.required_paths),
                    mkdirs=list(job.mkdirs),
                    job_name=job.job_name,  # a kill while sbatch runs is honoured on the login host
                    owner_comment=job.owner_comment,
                    secret_files=job.secret_files,
                )
            except NpaAmbiguousSubmission as exc:
                self.log.warning("Submission of %s is ambiguous (%s); reconciling by job name", job.job_name, exc)
                adopted = self._reconcile(hook, job, try_number)
                if adopted is not None:
                    return adopted
                if attempt == 2:
                    raise
                self.log.warning("No job named %s appeared; submitting again", job.job_name)
                continue
            self.log.info("Submitted %s as Slurm job %s", job.job_name, result.job_id)
            return self._handle_of(
                hook, job, result.job_id, try_number=try_number, retry_of=retry_of, cluster=result.cluster
            )
        raise AssertionError("unreachable")

    def _reconcile(self, hook: SlurmHook, job: PreparedJob, try_number: int) -> SlurmJobHandle | None:
        """After an ambiguous sbatch: adopt the one job with this name, fail on several, None if none."""
        deadline = time.monotonic() + RECONCILE_WINDOW_SECONDS
        while True:
            self.stop_if_killed(hook)  # on_kill has cancelled this name; the job may not even exist yet
            try:
                found = self._owned(hook.find_jobs_by_name([job.job_name]), TryNames(job.job_name))
            except Exception as exc:  # the cluster may still be unreachable: keep trying within the window
                self.log.warning("Looking up %s failed (%s); retrying", job.job_name, exc)
                found = None
            if found:
                return self._adopt_single(hook, job, found, try_number, "found by name after an ambiguous submission")
            if time.monotonic() >= deadline:
                if found is None:
                    raise NpaAmbiguousSubmission(
                        f"could not tell whether {job.job_name} was submitted: the cluster did not answer for "
                        f"{RECONCILE_WINDOW_SECONDS:.0f} s. Check `squeue --name={job.job_name}` before retrying."
                    )
                return None
            pause(RECONCILE_POLL_SECONDS)  # a polling interval, not a backoff: sacct catches up with sbatch

    def _adopt_single(
        self, hook: SlurmHook, job: PreparedJob, matches: list[SlurmJobInfo], try_number: int, why: str
    ) -> SlurmJobHandle:
        ids = sorted({m.job_id for m in matches})
        if len(ids) > 1:
            for job_id in ids:
                shred = job.secret_files if job_id == ids[-1] else ()  # they share one sidecar
                request = CancelRequest.for_job(job_id, job.job_name, script_path=job.script_path, shred=shred)
                self.cancel_through_outage(hook, request, "cancelling a duplicate")
            raise NpaAmbiguousSubmission(
                f"{len(ids)} Slurm jobs are named {job.job_name} ({', '.join(ids)}); all were cancelled so no "
                "duplicate keeps running. Retry the task to submit exactly one."
            )
        self.log.info("Adopting Slurm job %s (%s): %s", ids[0], job.job_name, why)
        submitted = self._submit_time(hook, ids[0], next((m.submitted_at for m in matches if m.job_id == ids[0]), None))
        return self._handle_of(hook, job, ids[0], try_number=try_number, retry_of=None, submitted_at=submitted)

    def _handle_of(self, hook: SlurmHook, job: PreparedJob, job_id: str, **details: Any) -> SlurmJobHandle:
        """The handle of `job` as `job_id`; `details`: try_number, retry_of, submitted_at and, from sbatch, cluster."""
        return handle_for(self.slurm_conn_id, hook.config, job, job_id, **details)

    @staticmethod
    def _script_file(job: PreparedJob) -> Any:
        from npa_airflow.slurm.staging import StagedFile

        return StagedFile(job.script_path, job.script.encode("utf-8"), 0o700)
