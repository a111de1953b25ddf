"""Slurm jobs as Airflow tasks: the lifecycle shared by every operator that runs one Slurm job per step.

`SlurmJobOperatorBase` finds the job of an earlier try (reattach or cancel), stages the rendered script and its
files and submits over one connection, reconciles an ambiguous submission by exact job name, pushes the handle
to XCom, waits (deferred in the triggerer, or on the worker through the same poller), then turns the outcome
into success, a program failure (no retry) or an infrastructure failure (retry with the bad nodes excluded).

Subclasses only say what to submit: `prepare_job(job_name, exclude_nodes, env, step)` returns a `PreparedJob`
and does no I/O; what it needs from outside (the connection, resolved secrets) comes in `env`, read by
`job_environment`, and local checks of the result (e.g. `bash -n`) run in `check_prepared_job`.

Each step of a task is its own method: `execute` starts the job (`start_job`) and defers to `execute_complete`; a
subclass with more steps (the NCCL probe's knob sets) defers to its own method with the step's state in the kwargs.

The operator keeps the steps (execute, defer, execute_complete, on_kill) and wires its collaborators: the try's
`ThisTry` (job.py: its hook, the step's prepared job and handle), `Submission` (submission.py: adopt or submit),
`Cancelling` (cancel.py) and `Completion` (completion.py: the event turned into the outcome).

Heavy imports (asyncssh via the hook) happen inside methods: importing this module in a DAG file is cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator

from npa_airflow.common import xcom_keys
from npa_airflow.common.checks import positive_duration
from npa_airflow.common.defaults import default_deferrable
from npa_airflow.common.links import SlurmJobLink
from npa_airflow.common.previous_try import checked_mode
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators.job import JobEnvironment, PreparedJob, ThisTry, on_job_cluster
from npa_airflow.slurm.operators.waiting import defer_timeout, trigger_deadline, wait_here

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

    from npa_airflow.common.deployment import Deployment
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.operators.cancel import Cancelling
    from npa_airflow.slurm.operators.submission import Submission


class SlurmJobOperatorBase(BaseOperator):
    """Run one Slurm job for this task instance and wait for it; see the module docstring.

    :param slurm_conn_id: the Slurm connection (login hosts, user, key, results root...).
    :param deferrable: wait in the triggerer (default) or on the worker (`False`).
    :param poll_interval: seconds between polls while the job runs (the shared poller has a 2 s floor).
    :param on_previous_try: a live job of an earlier try is adopted ("reattach") or cancelled ("cancel").
    :param success_marker: for COMPLETED jobs, also require this file (relative to the results dir).
    :param max_wait: how long after submission to wait before cancelling the job and failing the task, a
        ``timedelta`` or seconds (default: the execution timeout, else the wall time plus 24 h of queueing). It
        counts from the job's submission as Slurm recorded it, so a retry that reattaches to an earlier try's job
        gets no new budget.
    :param stream_logs: copy the job's stdout/stderr into the task log as it appears.
    :param cancel_on_kill: scancel the job when the task is killed (mark failed/success, clear).
    """

    operator_extra_links = (SlurmJobLink(),)
    # A long run in segments (operators/segments.py): SlurmSubmitOperator sets both; the others run one job a step.
    max_segments: int = 1
    max_preemptions: int = 0
    overwrite_rtif_after_execution: ClassVar[bool] = True  # the UI shows the script that was submitted
    ui_color = "#d8e9f7"

    def __init__(
        self,
        *,
        slurm_conn_id: str = "slurm_default",
        deferrable: bool | None = None,
        poll_interval: float = 15.0,
        on_previous_try: str = "reattach",
        success_marker: str | None = None,
        max_wait: timedelta | float | None = None,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        checked_mode(on_previous_try, "job", "submitting")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or poll_interval <= 0:
            raise NpaValidationError(f"poll_interval={poll_interval!r} must be a positive number of seconds")
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.poll_interval = float(poll_interval)
        self.on_previous_try = on_previous_try
        self.success_marker = success_marker
        self.max_wait = positive_duration(max_wait, "max_wait")
        self.stream_logs = stream_logs
        self.cancel_on_kill = cancel_on_kill
        self._this_try: ThisTry | None = None
        self._secrets_masked = False  # once per process: the worker that submits, the worker that completes

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """Airflow's fields, and the connection: the API server acts on this task's job with the connection the
        serialized DAG names, never with one a handle read back from XCom names (npa_airflow.plugin)."""
        return frozenset(super().get_serialized_fields() | {"slurm_conn_id"})

    def linked_job(self) -> dict[str, Any] | None:
        """The handle of the job this try has (the "Slurm job" link), None before or without one."""
        handle = self._this_try.handle if self._this_try is not None else None
        return handle.to_dict() if handle is not None else None

    def render_template(
        self,
        content: Any,
        context: Context,
        jinja_env: jinja2.Environment | None = None,
        seen_oids: set[int] | None = None,
    ) -> Any:
        """Airflow's rendering, keeping a value's final newline (Jinja drops it by default).

        Without this an environment value ending in "\n" reached the job without it, silently. Every template
        field renders through here (mapped tasks too), so each value arrives byte for byte.
        """
        env = jinja_env if jinja_env is not None else self.get_template_env()
        if not env.keep_trailing_newline:
            env = env.overlay(keep_trailing_newline=True)
        return super().render_template(content, context, env, seen_oids)

    # -- what to run (subclasses) ------------------------------------------------------------------------

    def prepare_job(
        self, job_name: str, exclude_nodes: Sequence[str], env: JobEnvironment, step: Mapping[str, Any]
    ) -> PreparedJob:
        """Render and validate the job for `job_name` (pure; called again with an earlier try's name).

        `step` holds the values of the current step (e.g. the probe's knob index); it is {} for one-step tasks.
        """
        raise NotImplementedError

    def job_environment(self, hook: SlurmHook) -> JobEnvironment:
        """Read what `prepare_job` needs from outside (default: the connection's settings)."""
        return JobEnvironment(config=hook.config)

    def check_prepared_job(self, job: PreparedJob) -> None:
        """Local checks of a prepared job (subclasses add theirs, e.g. `bash -n`): the script fits one command."""
        # DAG parse: the script builders are run-time only
        from npa_airflow.slurm.submit.scripts import check_script_size

        check_script_size(job.script)

    def cluster_read(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a read-only hook call through a short outage (better than burning a retry)."""
        # DAG parse: run-time only
        from npa_airflow.slurm.operators.outage import cluster_read

        return cluster_read(self.log, what, call, *args, **kwargs)

    def secret_references(self) -> dict[str, str]:
        """The `secret_env` references of this task's jobs ({} here): every process that writes the job's output
        resolves them and registers the values with its secrets masker first (`mask_job_secrets`)."""
        return {}

    def mask_job_secrets(self, values: Iterable[str] | None = None) -> bool:
        """Register the job's secret values (resolved now unless given) with this process's secrets masker, once.

        False when they could not be read: the caller then writes nothing of the job's output it read itself.
        """
        # DAG parse: run-time only
        from npa_airflow.slurm.operators.job_secrets import mask_secret_values

        refs = self.secret_references()
        if refs and not self._secrets_masked:
            if not mask_secret_values(refs, values, self.log):
                return False
            self._secrets_masked = True
        return True

    # -- identity ----------------------------------------------------------------------------------------

    @staticmethod
    def ti_identity(context: Context) -> tuple[str, str, str, int | None, int]:
        ti = context["ti"]
        map_index = getattr(ti, "map_index", None)
        return ti.dag_id, ti.task_id, ti.run_id, map_index, int(ti.try_number or 1)

    @staticmethod
    def deployment() -> Deployment:
        """This Airflow deployment's identity: it keys job names and owner proofs (`common.deployment`)."""
        # DAG parse: the deployment is read only when a task runs
        from npa_airflow.common.deployment import current_deployment

        return current_deployment()

    def job_name_for_context(self, context: Context) -> str:
        # DAG parse: the naming module is run-time only (the Slurm operators alone)
        from npa_airflow.common.naming import job_name_for

        return job_name_for(*self.ti_identity(context), deployment=self.deployment())

    def owner_comment(self, context: Context, job_name: str) -> str:
        """The proof this try gives the job it submits: read back by every later lookup by name."""
        return self.deployment().owner_comment(job_name, getattr(context["ti"], "id", None))

    def get_hook(self) -> SlurmHook:
        # DAG parse: the hook loads asyncssh
        from npa_airflow.slurm.hook import SlurmHook

        return SlurmHook(self.slurm_conn_id)

    def this_try(self, context: Context) -> ThisTry:
        """This try's hook (and through it the connection, read once) and what it built; made at its first use in
        the process, rendering or a step, and kept for the rest of the try."""
        identity = self.ti_identity(context)
        if self._this_try is None or self._this_try.identity != identity:
            self._this_try = ThisTry(identity, self.get_hook())
        return self._this_try

    def job_hook(self, handle: SlurmJobHandle) -> SlurmHook:
        """The hook for commands about `handle`'s job: scancel, sacct and scontrol name the cluster it is on."""
        return on_job_cluster(self._this_try.hook if self._this_try is not None else self.get_hook(), handle)

    def cancelling(self, this_try: ThisTry) -> Cancelling:
        """The cancels of `this_try`'s jobs (by handle, by request, by name while in flight)."""
        # DAG parse: the cancels load the Slurm command builders
        from npa_airflow.slurm.operators.cancel import Cancelling

        return Cancelling(this_try, self.log)

    # -- execute -----------------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        return self.submit_and_wait(context, self.job_name_for_context(context))

    def submit_and_wait(
        self,
        context: Context,
        job_name: str,
        *,
        step: Mapping[str, Any] | None = None,
        next_method: str = "execute_complete",
        next_kwargs: dict[str, Any] | None = None,
        counted_from: float | None = None,
    ) -> Any:
        """Adopt or submit the job `job_name`, then wait for it and hand its event to `next_method`. `counted_from`:
        when a continued run's first segment was submitted (max_wait counts from there)."""
        trigger = self.start_job(context, job_name, step, counted_from)
        if self.deferrable:
            self.defer(
                trigger=trigger, method_name=next_method, kwargs=next_kwargs, timeout=defer_timeout(trigger.deadline)
            )
        return getattr(self, next_method)(context, wait_here(trigger, self.log), **(next_kwargs or {}))

    def start_job(
        self, context: Context, job_name: str, step: Mapping[str, Any] | None, counted_from: float | None
    ) -> Any:
        """Adopt or submit the job `job_name`, publish its handle, and return the trigger to wait with (the job is
        settled first: script, checks; then each collaborator gets it once). Also the triggerer's start."""
        # DAG parse: the failure rules, the submission and the cluster checks load the Slurm command builders
        from npa_airflow.slurm.operators.bad_nodes import validated_exclusions
        from npa_airflow.slurm.operators.cluster_checks import check_on_cluster
        from npa_airflow.slurm.operators.submission import Submission

        hook = (this := self.this_try(context)).hook
        exclude = validated_exclusions(context, hook, self.log)
        env = self.job_environment(hook)
        step = dict(step or {})
        job = self.prepare_job(job_name, exclude, env, step)
        job = replace(job, owner_comment=self.owner_comment(context, job_name))
        self._show_submitted(job)
        self.check_prepared_job(job)
        submission = Submission.for_step(
            hook,
            job,
            self.log,
            self.cancelling(this),
            identity=self.ti_identity(context),
            deployment=self.deployment(),
            conn_id=self.slurm_conn_id,
            on_previous_try=self.on_previous_try,
            prepare_named=lambda name: self.prepare_job(name, (), env, step),
            segments=self.max_segments + self.max_preemptions,
        )
        check_on_cluster(hook, job, self.slurm_conn_id, self.log)
        this.handle, this.job = None, job  # on_kill cancels by this job's name until its id is known
        # waiting_try: the try that waits on the job, in the one XCom a trigger's on_kill reads to tell a clear
        # from a move (each XCom write is a round trip to Airflow)
        handle = replace(self._adopt_or_submit(context, submission), waiting_try=self.ti_identity(context)[4])
        this.handle = handle
        self.cancelling(this).stop_if_killed(hook, handle)
        self._publish(context, handle)
        trigger = self._trigger(handle, self._deadline(job, handle, counted_from))
        trigger.use_resolved_secrets(env.secrets.values())  # a wait in this process never resolves them again
        return trigger

    def _publish(self, context: Context, handle: SlurmJobHandle) -> None:
        """The handle to XCom before any wait: a kill, the listener and the next try find the job there, and a
        trigger's on_kill the try that waits on it."""
        context["ti"].xcom_push(key=xcom_keys.SLURM_JOB, value=handle.to_dict())
        self.log.info(
            "Slurm job %s (%s) on %s; stdout %s", handle.job_id, handle.job_name, handle.login_host, handle.stdout_path
        )

    def _adopt_or_submit(self, context: Context, submission: Submission) -> SlurmJobHandle:
        """The job of this step: an earlier try's or this try's found by name, else a new one."""
        return submission.run()

    def _show_submitted(self, job: PreparedJob) -> None:
        """Hook for subclasses that expose the final script as a template field."""

    def _deadline(self, job: PreparedJob, handle: SlurmJobHandle, counted_from: float | None) -> float:
        """When the wait for `handle`'s job ends (operators/waiting.py)."""
        return trigger_deadline(
            max_wait=self.max_wait,
            execution_timeout=self.execution_timeout,
            wall_seconds=job.wall_seconds,
            submitted_at=handle.submitted_at,
            counted_from=counted_from,
        )

    def _trigger_kwargs(self, handle: SlurmJobHandle, deadline: float | None) -> dict[str, Any]:
        """The wait's trigger; `continue_file`: the file by which a segment of a long run asks for the next one."""
        # DAG parse: the layout is run-time only
        from npa_airflow.slurm.submit.layout import continue_file

        return {
            "handle": handle.to_dict(),
            "conn_id": self.slurm_conn_id,
            "poll_interval": self.poll_interval,
            "deadline": deadline,
            "require_marker": self.success_marker,
            "stream_logs": self.stream_logs,
            "cancel_on_kill": self.cancel_on_kill,
            "secret_env": self.secret_references(),
            "continue_file": continue_file(handle.results_dir) if self.max_segments > 1 else None,
        }

    def _trigger(self, handle: SlurmJobHandle, deadline: float | None) -> Any:
        # DAG parse: the trigger loads the poller and the hook (asyncssh)
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        return SlurmJobTrigger(**self._trigger_kwargs(handle, deadline))

    # -- the end of a step, and a kill -----------------------------------------------------------------------

    def execute_complete(
        self, context: Context, event: dict[str, Any] | None = None, run: dict[str, Any] | None = None
    ) -> Any:
        """The job of `execute` (or a segment of its run, `run`) ended, or its wait did: succeed, fail, fail for
        a retry, or continue with the next segment."""
        return self.complete_job(context, event, own_job_name=self.job_name_for_context(context), run=run)

    def complete_job(
        self, context: Context, event: dict[str, Any] | None, *, own_job_name: str, run: dict[str, Any] | None = None
    ) -> Any:
        """Turn the wait's event into the task's outcome; `own_job_name` is the job this step itself submits."""
        # DAG parse: the completion loads the trigger module
        from npa_airflow.slurm.operators.completion import Completion
        from npa_airflow.slurm.operators.segments import NextSegment, RunState

        this = self.this_try(context)
        result = Completion(
            context,
            this,
            self.log,
            self.cancelling(this),
            own_job_name=own_job_name,
            mask_secrets=self.mask_job_secrets,
            restart=lambda: self.restart_after_clear(context),
            run=RunState.from_kwargs(run),
            max_segments=self.max_segments,
            max_preemptions=self.max_preemptions,
        ).outcome(event)
        return self.next_segment(context, result) if isinstance(result, NextSegment) else result

    def next_segment(self, context: Context, ended: Any) -> Any:
        """Submit the segment after `ended` (a `NextSegment`): same results dir, still deferred."""
        self.log.info("%s", ended.announcement(self.max_segments))
        return self.submit_and_wait(
            context, ended.next_name, next_kwargs=ended.run.to_kwargs(), counted_from=ended.run.first_submitted_at
        )

    def restart_after_clear(self, context: Context) -> Any:
        """Run this try from its first step again, as if it had just started (its own job, not an adopted one)."""
        return self.execute(context)

    def on_kill(self) -> None:
        """Airflow is killing the task (its SIGTERM handler calls this; SIGKILL follows 5 s later): cancel the job.

        By id once the job is known. While sbatch, or the reconciliation of an ambiguous submission, is still
        in flight, by this try's exact job name (no other try's or task's job has it), after creating the cancel
        marker that makes an sbatch still running on the login host cancel its own job when it returns. The
        interrupted submission then stops where it resumes (`Cancelling.stop_if_killed`).
        """
        this = self._this_try
        if this is None or this.done or not self.cancel_on_kill:
            return
        this.killed = True
        cancelling, handle = self.cancelling(this), this.handle
        if handle is not None:
            cancelling.cancel_job(this.hook_for(handle), handle, "the task was killed", killed=True)
        elif this.job is not None:
            cancelling.cancel_in_flight(self.get_hook(), this.job)
