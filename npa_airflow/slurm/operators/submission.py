"""Getting exactly one job for a step: adopt this try's or an earlier try's job, or submit a new one, and
reconcile an ambiguous submission by exact job name (`Submission`, made by the operator for each step).

An adopted job keeps Slurm's own submit time in its handle, so `max_wait` counts from the first submission
across reattaches. An earlier try's job that was cancelled outside Airflow is never silently replaced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from npa_airflow.common.naming import earlier_try_names, legacy_earlier_try_names, segment_job_name, segment_of
from npa_airflow.common.previous_try import on_previous_try
from npa_airflow.common.retry import pause
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaValidationError
from npa_airflow.slurm.operators.job import PreparedJob, handle_for
from npa_airflow.slurm.operators.outage import cluster_read
from npa_airflow.slurm.submit.job_owners import TryNames, describe_foreign, sort_by_owner
from npa_airflow.slurm.submit.staging import StagedFile
from npa_airflow.slurm.transport.cancels import CancelRequest

if TYPE_CHECKING:
    from npa_airflow.common.deployment import Deployment
    from npa_airflow.slurm.commands import SlurmJobInfo
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.cancel import Cancelling

RECONCILE_WINDOW_SECONDS = 45.0  # sacct can lag a few seconds behind sbatch
RECONCILE_POLL_SECONDS = 3.0


def try_names(
    identity: tuple[str, str, str, int | None, int], own: str, deployment: Deployment, segments: int = 1
) -> TryNames:
    """`own` (this step's job name) and the names of this task instance's earlier tries, both namings; with
    `segments` > 1 also each earlier try's later segments (a retry adopts a live one)."""
    earlier = [
        segment_job_name(name, k) if k > 1 else name
        for name in earlier_try_names(*identity, deployment=deployment)
        for k in range(1, segments + 1)
    ]
    return TryNames(own, tuple(earlier), tuple(legacy_earlier_try_names(*identity)))


@dataclass(eq=False, repr=False)
class Submission:
    """Adopt or submit the job of one step (`run`).

    :param hook: the try's hook.
    :param names: this step's job name and the earlier tries' names (`try_names`).
    :param job: this step's prepared job (its owner proof set).
    :param log: the task's logger.
    :param cancelling: cancels earlier tries' jobs and duplicates; stops the submission if the task is killed.
    :param conn_id: the connection the handle names.
    :param try_number: this try's number.
    :param deployment: whose owner proofs make a job found by name this task instance's.
    :param on_previous_try: "reattach" or "cancel" (`common.previous_try`).
    :param prepare_named: the job of another name as this step prepares it (an earlier try's script and sidecar).
    """

    hook: SlurmHook
    names: TryNames
    job: PreparedJob
    log: logging.Logger
    cancelling: Cancelling
    _: KW_ONLY
    conn_id: str
    try_number: int
    deployment: Deployment
    on_previous_try: str
    prepare_named: Callable[[str], PreparedJob]

    @classmethod
    def for_step(
        cls,
        hook: SlurmHook,
        job: PreparedJob,
        log: logging.Logger,
        cancelling: Cancelling,
        *,
        identity: tuple[str, str, str, int | None, int],
        deployment: Deployment,
        conn_id: str,
        on_previous_try: str,
        prepare_named: Callable[[str], PreparedJob],
        segments: int = 1,
    ) -> Submission:
        """The submission of `job` by the task-instance try `identity` (dag, task, run, map index, try); `segments`:
        how many jobs one try's run may take (earlier tries' later segments are looked for too)."""
        return cls(
            hook,
            try_names(identity, job.job_name, deployment, segments),
            job,
            log,
            cancelling,
            conn_id=conn_id,
            try_number=identity[4],
            deployment=deployment,
            on_previous_try=on_previous_try,
            prepare_named=prepare_named,
        )

    def run(self) -> SlurmJobHandle:
        """The handle of the job this step waits for: this try's own, an earlier try's, or a new one."""
        hook, job, names = self.hook, self.job, self.names
        lookup = cluster_read(self.log, "looking up earlier tries", hook.find_jobs_by_name, names.all)
        found = self._owned(lookup, names)
        mine = [j for j in found if j.job_name == job.job_name]
        if mine:  # this very try already submitted (its worker, or the triggerer that started it, died after sbatch)
            return self._adopt_single(mine, "this try's job, submitted before its start was interrupted")

        def by_try(j: SlurmJobInfo) -> tuple[int, int]:
            return names.try_of(j.job_name), segment_of(j.job_name)

        live = sorted((j for j in found if not j.state.is_terminal), key=by_try)
        previous = sorted(found, key=by_try)
        plan = on_previous_try(self.on_previous_try, live)
        if plan.adopt is not None:
            return self._reattach(plan.adopt, plan.cancel, by_try)
        if self.on_previous_try == "reattach" and previous and previous[-1].state is JobState.CANCELED:
            last = previous[-1]  # it would have been adopted: whose cancel was it?
            script = self._prepared_for(last.job_name).script_path
            self.cancelling.fail_unless_cancelled_by_airflow(
                hook, last.job_id, last.job_name or "", script, " of an earlier try"
            )
        if plan.cancel and job.required_paths:  # never cancel a running job for a submission that cannot happen
            self._require_inputs(plan.cancel[-1])
        for j in plan.cancel:
            self.log.info(
                "Cancelling Slurm job %s (%s) of an earlier try (on_previous_try='cancel')", j.job_id, j.job_name
            )
            earlier = self._prepared_for(j.job_name)
            request = CancelRequest.for_job(
                j.job_id, j.job_name, script_path=earlier.script_path, shred=earlier.secret_files
            )
            self.cancelling.cancel(hook, request, "cancelling an earlier try")
        retry_of = previous[-1].job_id if previous else None
        return self._submit(retry_of)

    def _owned(self, found: list[SlurmJobInfo], names: TryNames) -> list[SlurmJobInfo]:
        """The found jobs this task instance owns; the others holding its names are reported and left alone."""
        owners = sort_by_owner(found, names, self.deployment)
        for info in owners.foreign:
            self.log.warning(
                "%s has this task's job name but is not this task instance's job (another deployment sharing this "
                "cluster account, or a job made by hand): not adopting or cancelling it",
                describe_foreign(info),
            )
        return list(owners.owned)

    def _prepared_for(self, name: str | None) -> PreparedJob:
        """The job named `name` as its try prepared it (its script and sidecar paths), or this step's job itself."""
        if not name or name == self.job.job_name:
            return self.job
        return self.prepare_named(name)

    def _submit_time(self, job_id: str, known: float | None = None) -> float | None:
        """Slurm's submit time of an adopted job (`known`: the lookup read it): max_wait counts from there."""
        if known is not None:
            return known
        try:
            return cluster_read(self.log, "reading the job's submit time", self.hook.submit_time, job_id)
        except Exception as exc:
            self.log.warning("Could not read when Slurm job %s was submitted (%s); counting from now", job_id, exc)
            return None

    def _reattach(
        self,
        keep: SlurmJobInfo,
        duplicates: tuple[SlurmJobInfo, ...],
        try_of: Callable[[SlurmJobInfo], tuple[int, int]],
    ) -> SlurmJobHandle:
        """Adopt `keep`, the newest live job of an earlier try; cancel the older live `duplicates`."""
        for extra in duplicates:
            self.log.warning("Cancelling duplicate live job %s (%s) of an earlier try", extra.job_id, extra.job_name)
            duplicate = self._prepared_for(extra.job_name)
            # A duplicate of the same name shares the kept job's sidecar: that one stays.
            shred = duplicate.secret_files if extra.job_name != keep.job_name else ()
            request = CancelRequest.for_job(
                extra.job_id, extra.job_name, script_path=duplicate.script_path, shred=shred
            )
            self.cancelling.cancel(self.hook, request, "cancelling a duplicate")
        self.log.info(
            "Reattaching to Slurm job %s (%s) of an earlier try instead of submitting a new one",
            keep.job_id,
            keep.job_name,
        )
        old = self.prepare_named(keep.job_name or self.job.job_name)
        submitted = self._submit_time(keep.job_id, keep.submitted_at)
        return self._handle_of(old, keep.job_id, try_number=try_of(keep)[0], retry_of=None, submitted_at=submitted)

    def _require_inputs(self, running: SlurmJobInfo) -> None:
        paths = list(self.job.required_paths)
        exists = cluster_read(self.log, "checking inputs", self.hook.paths_exist, paths)
        missing = [p for p, ok in exists.items() if not ok]
        if missing:
            raise NpaValidationError(
                f"required inputs do not exist on the cluster: {', '.join(missing)}; the earlier try's job "
                f"{running.job_id} was left running. Stage the data on shared storage first."
            )

    def _submit(self, retry_of: str | None) -> SlurmJobHandle:
        hook, job = self.hook, self.job
        for attempt in (1, 2):
            self.cancelling.stop_if_killed(hook)
            try:
                result = hook.stage_and_submit(
                    [*job.files, script_file(job)],
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
                adopted = self._reconcile()
                if adopted is not None:
                    return adopted
                if attempt == 2:
                    raise
                self.log.warning("No job named %s appeared; submitting again", job.job_name)
                continue
            self.log.info("Submitted %s as Slurm job %s", job.job_name, result.job_id)
            return self._handle_of(
                job, result.job_id, try_number=self.try_number, retry_of=retry_of, cluster=result.cluster
            )
        raise AssertionError("unreachable")

    def _reconcile(self) -> SlurmJobHandle | None:
        """After an ambiguous sbatch: adopt the one job with this name, fail on several, None if none."""
        name = self.job.job_name
        deadline = time.monotonic() + RECONCILE_WINDOW_SECONDS
        while True:
            self.cancelling.stop_if_killed(self.hook)  # on_kill has cancelled this name; the job may not exist yet
            try:
                found = self._owned(self.hook.find_jobs_by_name([name]), TryNames(name))
            except Exception as exc:  # the cluster may still be unreachable: keep trying within the window
                self.log.warning("Looking up %s failed (%s); retrying", name, exc)
                found = None
            if found:
                return self._adopt_single(found, "found by name after an ambiguous submission")
            if time.monotonic() >= deadline:
                if found is None:
                    raise NpaAmbiguousSubmission(
                        f"could not tell whether {name} was submitted: the cluster did not answer for "
                        f"{RECONCILE_WINDOW_SECONDS:.0f} s. Check `squeue --name={name}` before retrying."
                    )
                return None
            pause(RECONCILE_POLL_SECONDS)  # a polling interval, not a backoff: sacct catches up with sbatch

    def _adopt_single(self, matches: list[SlurmJobInfo], why: str) -> SlurmJobHandle:
        job = self.job
        ids = sorted({m.job_id for m in matches})
        if len(ids) > 1:
            for job_id in ids:
                shred = job.secret_files if job_id == ids[-1] else ()  # they share one sidecar
                request = CancelRequest.for_job(job_id, job.job_name, script_path=job.script_path, shred=shred)
                self.cancelling.cancel(self.hook, request, "cancelling a duplicate")
            raise NpaAmbiguousSubmission(
                f"{len(ids)} Slurm jobs are named {job.job_name} ({', '.join(ids)}); all were cancelled so no "
                "duplicate keeps running. Retry the task to submit exactly one."
            )
        self.log.info("Adopting Slurm job %s (%s): %s", ids[0], job.job_name, why)
        submitted = self._submit_time(ids[0], next((m.submitted_at for m in matches if m.job_id == ids[0]), None))
        return self._handle_of(job, ids[0], try_number=self.try_number, retry_of=None, submitted_at=submitted)

    def _handle_of(self, job: PreparedJob, job_id: str, **details: Any) -> SlurmJobHandle:
        """The handle of `job` as `job_id`; `details`: try_number, retry_of, submitted_at and, from sbatch, cluster."""
        return handle_for(self.conn_id, self.hook.config, job, job_id, **details)


def script_file(job: PreparedJob) -> Any:
    """The sbatch script as a file to stage (executable by its owner only)."""
    return StagedFile(job.script_path, job.script.encode("utf-8"), 0o700)
