"""Slurm jobs as Airflow tasks.

`SlurmJobOperatorBase` owns the lifecycle shared by every operator that runs one Slurm job per task
instance: find the job of an earlier try (reattach or cancel), stage the rendered script and its files and
submit over one connection, reconcile an ambiguous submission by exact job name, push the handle to XCom,
wait (deferred in the triggerer, or on the worker through the same poller), then turn the outcome into
success, a program failure (no retry) or an infrastructure failure (retry with the bad nodes excluded).

Subclasses only say what to submit: `prepare_job(context, job_name, exclude_nodes)` returns a
`PreparedJob` (pure: no I/O). `SlurmSubmitOperator` builds it from an `SbatchSpec`.

Heavy imports (asyncssh via the hook) happen inside methods: importing this module in a DAG file is cheap.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from airflow.sdk import BaseOperator

from npa_airflow.common.defaults import default_deferrable
from npa_airflow.common.links import SLURM_TRY_XCOM_KEY, SLURM_XCOM_KEY, SlurmJobLink
from npa_airflow.exceptions import (
    NpaAmbiguousSubmission,
    NpaConnectionError,
    NpaHostKeyError,
    NpaRemoteError,
    NpaValidationError,
)

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

    from npa_airflow.slurm.commands import SlurmJobInfo
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook

ON_PREVIOUS_TRY = ("reattach", "cancel")
RECONCILE_WINDOW_SECONDS = 45.0  # sacct can lag a few seconds behind sbatch
RECONCILE_POLL_SECONDS = 3.0
DEFAULT_PENDING_ALLOWANCE = timedelta(hours=24)
LOG_TAIL_BYTES = 8192
READ_RETRY_SECONDS = 90.0  # read-only cluster queries before submit ride out a short slurmctld/sshd outage
EXCLUDE_VARIABLE_PREFIX = "npa_slurm_exclude__"
_TRY_SUFFIX_RE = re.compile(r"-t([0-9]+)$")
T = TypeVar("T")


@dataclass(frozen=True)
class PreparedJob:
    """Everything needed to stage and submit one job; built without I/O."""

    job_name: str
    script: str  # the exact sbatch script that is submitted
    script_path: str
    results_dir: str
    stdout_path: str
    stderr_path: str
    mkdirs: tuple[str, ...] = ()
    required_paths: tuple[str, ...] = ()
    files: tuple[Any, ...] = ()  # staging.StagedFile: extra files (e.g. the mode-600 credentials sidecar)
    sbatch_args: tuple[str, ...] = ()
    wall_seconds: float | None = None
    partition: str | None = None  # checked against the cluster's partitions (exists, MaxTime)
    time_minutes: int | None = None
    secret_values: tuple[str, ...] = field(default=(), repr=False)  # must never appear in the script


def try_of(job_name: str) -> int:
    m = _TRY_SUFFIX_RE.search(job_name)
    return int(m.group(1)) if m else 1


class SlurmJobOperatorBase(BaseOperator):
    """Run one Slurm job for this task instance and wait for it; see the module docstring.

    :param slurm_conn_id: the Slurm connection (login hosts, user, key, results root...).
    :param deferrable: wait in the triggerer (default) or on the worker (`False`).
    :param poll_interval: seconds between polls while the job runs (the shared poller has a 2 s floor).
    :param on_previous_try: a live job of an earlier try is adopted ("reattach") or cancelled ("cancel").
    :param success_marker: for COMPLETED jobs, also require this file (relative to the results dir).
    :param max_wait: how long after submission to wait before cancelling the job and failing the task
        (default: the execution timeout, else the wall time plus 24 h of queueing).
    :param stream_logs: copy the job's stdout/stderr into the task log as it appears.
    :param cancel_on_kill: scancel the job when the task is killed (mark failed/success, clear).
    """

    operator_extra_links = (SlurmJobLink(),)
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
        max_wait: timedelta | None = None,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if on_previous_try not in ON_PREVIOUS_TRY:
            raise NpaValidationError(
                f"on_previous_try={on_previous_try!r} must be one of {ON_PREVIOUS_TRY} "
                "(adopt the earlier try's live job, or cancel it before submitting a new one)"
            )
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or poll_interval <= 0:
            raise NpaValidationError(f"poll_interval={poll_interval!r} must be a positive number of seconds")
        if max_wait is not None and (not isinstance(max_wait, timedelta) or max_wait <= timedelta(0)):
            raise NpaValidationError(f"max_wait={max_wait!r} must be a positive datetime.timedelta")
        self.slurm_conn_id = slurm_conn_id
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.poll_interval = float(poll_interval)
        self.on_previous_try = on_previous_try
        self.success_marker = success_marker
        self.max_wait = max_wait
        self.stream_logs = stream_logs
        self.cancel_on_kill = cancel_on_kill
        self._handle: SlurmJobHandle | None = None
        self._done = False

    # -- what to run (subclasses) ------------------------------------------------------------------------

    def prepare_job(self, context: Context, job_name: str, exclude_nodes: Sequence[str]) -> PreparedJob:
        """Render and validate the job for `job_name` (pure; called again with an earlier try's name)."""
        raise NotImplementedError

    def check_on_cluster(self, hook: SlurmHook, job: PreparedJob) -> None:
        """Read-only checks before anything is written: the partition exists and allows the wall time."""
        if job.partition is None and job.time_minutes is None:
            return
        partitions = self.cluster_read("reading partitions", hook.partitions)
        name = job.partition or next((p.name for p in partitions.values() if p.default), None)
        if name is None:
            return
        for part in name.split(","):
            info = partitions.get(part)
            if info is None:
                raise NpaValidationError(
                    f"partition {part!r} does not exist on the cluster of connection {self.slurm_conn_id!r}; "
                    f"known partitions: {', '.join(sorted(partitions)) or 'none'}"
                )
            limit = info.max_time_minutes
            if limit is not None and job.time_minutes is not None and job.time_minutes > limit:
                raise NpaValidationError(
                    f"time_hours asks for {job.time_minutes} min but partition {part!r} allows at most {limit} min "
                    "(MaxTime); lower time_hours or choose a partition whose MaxTime allows it"
                )

    # -- identity ----------------------------------------------------------------------------------------

    @staticmethod
    def ti_identity(context: Context) -> tuple[str, str, str, int | None, int]:
        ti = context["ti"]
        map_index = getattr(ti, "map_index", None)
        return ti.dag_id, ti.task_id, ti.run_id, map_index, int(ti.try_number or 1)

    def job_name_for_context(self, context: Context) -> str:
        from npa_airflow.common.naming import job_name_for

        return job_name_for(*self.ti_identity(context))

    def get_hook(self) -> SlurmHook:
        from npa_airflow.slurm.hook import SlurmHook

        return SlurmHook(self.slurm_conn_id)

    def cluster_read(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a read-only (or idempotent) hook call, retrying transient failures with jittered backoff.

        Nothing has been submitted yet, so waiting out a short outage is better than burning a retry.
        """
        deadline = time.monotonic() + READ_RETRY_SECONDS
        attempt = 0
        while True:
            try:
                return call(*args, **kwargs)
            except NpaHostKeyError:
                raise
            except (NpaRemoteError, NpaConnectionError) as exc:
                attempt += 1
                delay = min(2.0**attempt, 15.0) * random.uniform(1.0, 1.5)
                if time.monotonic() + delay > deadline:
                    raise
                self.log.warning("%s failed (%s); retrying in %.0f s", what, exc, delay)
                time.sleep(delay)

    # -- execute -----------------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        hook = self.get_hook()
        job_name = self.job_name_for_context(context)
        exclude = self._validated_exclusions(context, hook)
        job = self.prepare_job(context, job_name, exclude)
        self._show_submitted(job)
        self.check_on_cluster(hook, job)
        handle = self._adopt_or_submit(context, hook, job)
        self._handle = handle
        context["ti"].xcom_push(key=SLURM_XCOM_KEY, value=handle.to_dict())
        context["ti"].xcom_push(key=SLURM_TRY_XCOM_KEY, value=self.ti_identity(context)[4])
        self.log.info(
            "Slurm job %s (%s) on %s; stdout %s", handle.job_id, handle.job_name, handle.login_host, handle.stdout_path
        )
        trigger = self._trigger(handle, self._deadline(handle, job))
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete", timeout=self._defer_timeout(trigger))
        return self.execute_complete(context, self._wait_here(trigger))

    def _show_submitted(self, job: PreparedJob) -> None:
        """Hook for subclasses that expose the final script as a template field."""

    def _deadline(self, handle: SlurmJobHandle, job: PreparedJob) -> float:
        start = handle.submitted_at or time.time()
        if self.max_wait is not None:
            return start + self.max_wait.total_seconds()
        if self.execution_timeout is not None:
            return start + self.execution_timeout.total_seconds()
        return start + (job.wall_seconds or 0) + DEFAULT_PENDING_ALLOWANCE.total_seconds()

    @staticmethod
    def _defer_timeout(trigger: Any) -> timedelta | None:
        # Airflow's own deferral timeout would drop the trigger without cancelling the job: keep it well
        # behind the trigger's deadline, which fires an event the operator turns into a cancel.
        if trigger.deadline is None:
            return None
        return timedelta(seconds=max(0.0, trigger.deadline - time.time()) + 600)

    def _trigger(self, handle: SlurmJobHandle, deadline: float | None, log_offsets: dict | None = None) -> Any:
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        return SlurmJobTrigger(
            handle=handle.to_dict(),
            conn_id=self.slurm_conn_id,
            poll_interval=self.poll_interval,
            deadline=deadline,
            require_marker=self.success_marker,
            log_offsets=log_offsets or {},
            stream_logs=self.stream_logs,
            cancel_on_kill=self.cancel_on_kill,
        )

    def _wait_here(self, trigger: Any) -> dict[str, Any]:
        """Non-deferrable: run the same trigger (and shared poller) on this worker until its event."""
        trigger._log = self.log  # the job's output goes to this task's log

        async def first_event() -> Any:
            gen = trigger.run()
            try:
                return await anext(gen)
            finally:
                await gen.aclose()

        return asyncio.run(first_event()).payload

    # -- earlier tries, submission, reconciliation ---------------------------------------------------------

    def _adopt_or_submit(self, context: Context, hook: SlurmHook, job: PreparedJob) -> SlurmJobHandle:
        from npa_airflow.common.naming import earlier_try_names

        dag_id, task_id, run_id, map_index, try_number = self.ti_identity(context)
        earlier = earlier_try_names(dag_id, task_id, run_id, map_index, try_number)
        found = self.cluster_read("looking up earlier tries", hook.find_jobs_by_name, [*earlier, job.job_name])

        mine = [j for j in found if j.job_name == job.job_name]
        if mine:  # this very try already submitted (the worker died after sbatch and came back)
            return self._adopt_single(hook, job, mine, "this try's job, submitted before the worker restarted")

        live = sorted((j for j in found if not j.state.is_terminal), key=lambda j: try_of(j.job_name or ""))
        if live and self.on_previous_try == "reattach":
            keep = live[-1]
            for extra in live[:-1]:
                self.log.warning(
                    "Cancelling duplicate live job %s (%s) of an earlier try", extra.job_id, extra.job_name
                )
                self.cluster_read("cancelling a duplicate", hook.cancel, extra.job_id)
            self.log.info(
                "Reattaching to Slurm job %s (%s) of an earlier try instead of submitting a new one",
                keep.job_id,
                keep.job_name,
            )
            old = self.prepare_job(context, keep.job_name or job.job_name, ())
            return self._handle_for(hook, old, keep.job_id, retry_of=None)
        if live and job.required_paths:  # never cancel a running job for a submission that cannot happen
            exists = self.cluster_read("checking inputs", hook.paths_exist, list(job.required_paths))
            missing = [p for p, ok in exists.items() if not ok]
            if missing:
                raise NpaValidationError(
                    f"required inputs do not exist on the cluster: {', '.join(missing)}; the earlier try's job "
                    f"{live[-1].job_id} was left running. Stage the data on shared storage first."
                )
        for j in live:
            self.log.info(
                "Cancelling Slurm job %s (%s) of an earlier try (on_previous_try='cancel')", j.job_id, j.job_name
            )
            self.cluster_read("cancelling an earlier try", hook.cancel, j.job_id)

        previous = sorted(found, key=lambda j: try_of(j.job_name or ""))
        retry_of = previous[-1].job_id if previous else None
        return self._submit(hook, job, retry_of)

    def _submit(self, hook: SlurmHook, job: PreparedJob, retry_of: str | None) -> SlurmJobHandle:
        for attempt in (1, 2):
            try:
                result = hook.stage_and_submit(
                    [*job.files, self._script_file(job)],
                    job.script_path,
                    sbatch_args=list(job.sbatch_args),
                    required_paths=list(job.required_paths),
                    mkdirs=list(job.mkdirs),
                )
            except NpaAmbiguousSubmission as exc:
                self.log.warning("Submission of %s is ambiguous (%s); reconciling by job name", job.job_name, exc)
                adopted = self._reconcile(hook, job, retry_of)
                if adopted is not None:
                    return adopted
                if attempt == 2:
                    raise
                self.log.warning("No job named %s appeared; submitting again", job.job_name)
                continue
            self.log.info("Submitted %s as Slurm job %s", job.job_name, result.job_id)
            return self._handle_for(hook, job, result.job_id, retry_of=retry_of, cluster=result.cluster)
        raise AssertionError("unreachable")

    def _reconcile(self, hook: SlurmHook, job: PreparedJob, retry_of: str | None) -> SlurmJobHandle | None:
        """After an ambiguous sbatch: adopt the one job with this name, fail on several, None if none."""
        deadline = time.monotonic() + RECONCILE_WINDOW_SECONDS
        while True:
            try:
                found = [j for j in hook.find_jobs_by_name([job.job_name]) if j.job_name == job.job_name]
            except Exception as exc:  # the cluster may still be unreachable: keep trying within the window
                self.log.warning("Looking up %s failed (%s); retrying", job.job_name, exc)
                found = None
            if found:
                return self._adopt_single(hook, job, found, "found by name after an ambiguous submission")
            if time.monotonic() >= deadline:
                if found is None:
                    raise NpaAmbiguousSubmission(
                        f"could not tell whether {job.job_name} was submitted: the cluster did not answer for "
                        f"{RECONCILE_WINDOW_SECONDS:.0f} s. Check `squeue --name={job.job_name}` before retrying."
                    )
                return None
            time.sleep(RECONCILE_POLL_SECONDS)

    def _adopt_single(self, hook: SlurmHook, job: PreparedJob, matches: list[SlurmJobInfo], why: str) -> SlurmJobHandle:
        ids = sorted({m.job_id for m in matches})
        if len(ids) > 1:
            for job_id in ids:
                self.cluster_read("cancelling a duplicate", hook.cancel, job_id)
            raise NpaAmbiguousSubmission(
                f"{len(ids)} Slurm jobs are named {job.job_name} ({', '.join(ids)}); all were cancelled so no "
                "duplicate keeps running. Retry the task to submit exactly one."
            )
        self.log.info("Adopting Slurm job %s (%s): %s", ids[0], job.job_name, why)
        return self._handle_for(hook, job, ids[0], retry_of=None)

    def _handle_for(
        self, hook: SlurmHook, job: PreparedJob, job_id: str, *, retry_of: str | None, cluster: str | None = None
    ) -> SlurmJobHandle:
        from npa_airflow.slurm.handle import SlurmJobHandle

        cfg = hook.config
        host, port = cfg.hosts[0]
        return SlurmJobHandle(
            conn_id=self.slurm_conn_id,
            cluster=cluster or cfg.cluster_name,
            job_id=str(job_id),
            job_name=job.job_name,
            login_host=f"{host}:{port}",
            results_dir=job.results_dir,
            stdout_path=job.stdout_path.replace("%j", str(job_id)).replace("%x", job.job_name),
            stderr_path=job.stderr_path.replace("%j", str(job_id)).replace("%x", job.job_name),
            try_number=try_of(job.job_name),
            retry_of=retry_of,
            submitted_at=time.time(),
        )

    @staticmethod
    def _script_file(job: PreparedJob) -> Any:
        from npa_airflow.slurm.staging import StagedFile

        return StagedFile(job.script_path, job.script.encode("utf-8"), 0o700)

    # -- bad nodes carried from an infrastructure failure to the next try ----------------------------------

    def _exclusion_key(self, context: Context) -> str:
        from npa_airflow.common.naming import task_instance_hash

        dag_id, task_id, run_id, map_index, _ = self.ti_identity(context)
        return EXCLUDE_VARIABLE_PREFIX + task_instance_hash(dag_id, task_id, run_id, map_index)

    def _validated_exclusions(self, context: Context, hook: SlurmHook) -> list[str]:
        from airflow.sdk import Variable

        try:
            carried = Variable.get(self._exclusion_key(context), default=None, deserialize_json=True)
        except Exception:
            carried = None
        if not carried:
            return []
        nodes = self.cluster_read("reading nodes", hook.nodes)
        valid = [n for n in carried if n in nodes]
        dropped = sorted(set(carried) - set(valid))
        if dropped:
            self.log.warning("Not excluding %s: no such node in `scontrol show nodes`", ", ".join(dropped))
        if valid:
            self.log.info("Excluding node(s) %s that failed an earlier try", ", ".join(valid))
        return valid

    def _record_bad_nodes(self, context: Context, hook: SlurmHook, bad_nodes: Sequence[str]) -> list[str]:
        from airflow.sdk import Variable

        if not bad_nodes:
            return []
        try:
            known = hook.nodes()
        except Exception as exc:
            self.log.warning("Could not validate bad nodes against scontrol (%s); not excluding them", exc)
            return []
        from npa_airflow.slurm.failures import validate_exclusions

        valid = sorted(validate_exclusions(bad_nodes, known))
        if not valid:
            return []
        key = self._exclusion_key(context)
        try:
            previous = Variable.get(key, default=None, deserialize_json=True) or []
            Variable.set(key, sorted(set(previous) | set(valid)), serialize_json=True)
        except Exception as exc:
            self.log.warning("Could not record bad nodes %s for the next try: %s", ", ".join(valid), exc)
            return []
        return valid

    def _forget_bad_nodes(self, context: Context) -> None:
        from airflow.sdk import Variable

        try:
            if Variable.get(self._exclusion_key(context), default=None) is not None:
                Variable.delete(self._exclusion_key(context))
        except Exception as exc:
            self.log.debug("Could not clear the node exclusion variable: %s", exc)

    # -- completion --------------------------------------------------------------------------------------

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from npa_airflow.slurm.handle import SlurmJobHandle
        from npa_airflow.slurm.triggers import validate_event

        try:
            event = validate_event(event)
        except ValueError as exc:
            raise AirflowException(f"Slurm wait ended with an unusable event: {exc}") from exc
        handle = SlurmJobHandle.from_dict(event["handle"])
        self._handle = handle
        status = event["status"]
        job = f"Slurm job {handle.job_id} ({handle.job_name})"
        if status == "success":
            self._done = True
            self._forget_bad_nodes(context)
            self.log.info("%s completed", job)
            return handle.to_dict()
        hook = self.get_hook()
        if status == "deadline":
            self._cancel(hook, handle, "its deadline passed")
            self._done = True
            raise AirflowException(
                f"{job} did not finish before its deadline (max_wait / execution_timeout); it was cancelled"
            )
        if status == "canceled" and handle.job_name != self.job_name_for_context(context):
            # This try had reattached to an earlier try's job, and that job was cancelled: the user cleared the
            # earlier try (its trigger's on_kill cancels). A clear means "run again": submit this try's own job.
            self.log.warning("%s of an earlier try was cancelled (task cleared); submitting a new job", job)
            return self.execute(context)
        self._done = True
        if status == "canceled":
            raise AirflowFailException(f"{job} was cancelled outside Airflow ({event.get('native_state')})")
        tail = self._log_tail(hook, handle) or event.get("log_tail") or ""
        if status == "marker_missing":
            raise AirflowFailException(f"{event['message']}\n--- last lines of the job's output ---\n{tail}")
        verdict = self._classify(event, tail)
        if verdict[0] == "infra":
            excluded = self._record_bad_nodes(context, hook, verdict[2])
            where = f"; the next try excludes {', '.join(excluded)}" if excluded else ""
            raise AirflowException(
                f"{job} failed for an infrastructure reason ({verdict[1]}){where}. "
                f"--- last lines of the job's output ---\n{tail}"
            )
        raise AirflowFailException(
            f"{event['message']}: a program failure, not retried.\n--- last lines of the job's output ---\n{tail}"
        )

    def _classify(self, event: dict[str, Any], tail: str) -> tuple[str, str, list[str]]:
        """("infra" | "program", evidence, bad nodes) from the final state and the log tail."""
        from npa_airflow.common.states import JobState
        from npa_airflow.slurm.commands import SlurmJobInfo
        from npa_airflow.slurm.failures import classify

        info = SlurmJobInfo(
            job_id=str(event["job_id"]),
            native_state=str(event.get("native_state") or "UNKNOWN"),
            state=JobState(event.get("state") or "ERROR"),
            exit_code=event.get("exit_code"),
            signal=event.get("signal"),
            job_name=event["handle"].get("job_name"),
            node_list=event.get("node_list"),
            reason=event.get("reason"),
            source="event",
        )
        verdict = classify(info, tail)
        return verdict.kind, verdict.evidence, list(verdict.bad_nodes)

    def _log_tail(self, hook: SlurmHook, handle: SlurmJobHandle) -> str:
        paths = list(dict.fromkeys([handle.stdout_path, handle.stderr_path]))
        try:
            sizes = hook.tail_logs([(p, 0) for p in paths], max_bytes=1)
            requests = [(c.path, max(0, c.size - LOG_TAIL_BYTES)) for c in sizes if c.size > 0]
            chunks = hook.tail_logs(requests, max_bytes=LOG_TAIL_BYTES) if requests else []
        except Exception as exc:
            self.log.warning("Could not read the end of the job's log: %s", exc)
            return ""
        parts = []
        for chunk in chunks:
            text = chunk.data.decode("utf-8", errors="replace")
            label = "stderr" if chunk.path == handle.stderr_path and len(paths) > 1 else "stdout"
            parts.append(f"[{label} {chunk.path}]\n{text.rstrip()}")
        return "\n".join(parts)

    # -- cancel ------------------------------------------------------------------------------------------

    def _cancel(self, hook: SlurmHook, handle: SlurmJobHandle, why: str, patient: bool = True) -> None:
        try:
            if patient:
                self.cluster_read("cancelling", hook.cancel, handle.job_id)
            else:  # on_kill: the worker is being stopped, one attempt
                hook.cancel(handle.job_id)
            self.log.info("Cancelled Slurm job %s (%s)", handle.job_id, why)
        except Exception as exc:
            self.log.error("Could not cancel Slurm job %s (%s): %s", handle.job_id, why, exc)

    def on_kill(self) -> None:
        """The worker is killing the task (non-deferrable wait, or between submit and defer): scancel."""
        if self._handle is None or self._done or not self.cancel_on_kill:
            return
        self._cancel(self.get_hook(), self._handle, "the task was killed", patient=False)


# -------------------------------------------------------------------------------------------------------


def _secret_env_values(secret_env: Mapping[str, str]) -> dict[str, str]:
    """Resolve {ENV_NAME: "var:NAME" | "conn:CONN_ID[:password|login|extra_key]"} at execute time."""
    from airflow.sdk import BaseHook, Variable

    values: dict[str, str] = {}
    for name, source in secret_env.items():
        kind, _, ref = source.partition(":")
        if kind == "var":
            values[name] = str(Variable.get(ref))
        elif kind == "conn":
            conn_id, _, attr = ref.partition(":")
            conn = BaseHook.get_connection(conn_id)
            attr = attr or "password"
            if attr in ("password", "login", "host", "schema"):
                value = getattr(conn, attr)
            else:
                value = conn.extra_dejson.get(attr)
            if value in (None, ""):
                raise NpaValidationError(f"secret_env[{name!r}]: connection {conn_id!r} has no {attr!r}")
            values[name] = str(value)
    return values


def validate_secret_env(secret_env: Mapping[str, str] | None) -> dict[str, str]:
    if not secret_env:
        return {}
    if not isinstance(secret_env, Mapping):
        raise NpaValidationError(f"secret_env={secret_env!r} must map ENV_NAME -> 'var:NAME' or 'conn:CONN_ID[:field]'")
    out = {}
    for name, source in secret_env.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise NpaValidationError(f"secret_env key {name!r} is not an environment variable name")
        if not isinstance(source, str) or not re.fullmatch(
            r"(var:[A-Za-z0-9_.-]+|conn:[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?)", source
        ):
            raise NpaValidationError(
                f"secret_env[{name!r}]={source!r}: name where the secret lives, as 'var:VARIABLE_NAME' or "
                "'conn:CONNECTION_ID[:password|login|extra_key]' (never the secret itself)"
            )
        out[name] = source
    return out


class SlurmSubmitOperator(SlurmJobOperatorBase):
    """Submit one sbatch job rendered from the seed's templates and wait for it (deferrable).

    Resources and commands mirror `SbatchSpec` (see its docstring for defaults and limits). `results_root`
    and `partition`/`account` default to the connection's. Each try gets its own results directory
    `<results_root>/<job name>`; `{results_dir}`, `{job_id}` (the job name: this try's record id) and
    `{config_path}` are bound in commands and environment.

    :param inputs: datasets/files the job reads (`lustre:///abs/path` or absolute shared paths); each is
        checked with `test -e` on the cluster before anything is written.
    :param secret_env: {ENV_NAME: "var:VARIABLE" | "conn:CONN_ID[:field]"}: session credentials written to
        a mode-600 sidecar the job sources and shreds; never in the script, logs, XCom or template fields.
    :param exclude_nodes: nodes never to use (bad nodes from infrastructure failures are added per try).
    :param success_marker: the template writes `status.json` into the results dir only when every task
        succeeded; a COMPLETED job without it fails the task. `None` trusts the Slurm state alone.

    The rendered script is the template field `sbatch_script` ("Rendered Template" in the UI).
    `command` and the other text fields are Jinja templates: bash's `${#VAR}` opens a Jinja comment, so
    write `{{ '${#VAR}' }}` (or avoid it).
    """

    template_fields: Sequence[str] = (
        "command",
        "environment",
        "partition",
        "account",
        "image",
        "container_mounts",
        "extra_sbatch",
        "pre_commands",
        "post_commands",
        "leader_post_commands",
        "inputs",
        "results_root",
        "log_dir",
        "config_path",
        "sbatch_script",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "sbatch_script": "bash",
        "command": "bash",
        "environment": "json",
    }

    def __init__(
        self,
        *,
        command: str,
        nodes: int = 1,
        gpus_per_node: int = 4,
        cpus_per_task: int = 16,
        time_hours: float = 4.0,
        timeout_hours: float | None = None,
        max_gpus_per_node: int = 8,
        partition: str | None = None,
        account: str | None = None,
        image: str | None = None,
        container_mounts: Sequence[str] = (),
        environment: Mapping[str, str] | None = None,
        extra_sbatch: Sequence[str] = (),
        requeue: bool = True,
        pre_commands: Sequence[str] = (),
        post_commands: Sequence[str] = (),
        leader_post_commands: Sequence[str] = (),
        inputs: Sequence[str] = (),
        results_root: str | None = None,
        log_dir: str | None = None,
        config_path: str | None = None,
        secret_env: Mapping[str, str] | None = None,
        exclude_nodes: Sequence[str] = (),
        success_marker: str | None = "status.json",
        **kwargs: Any,
    ) -> None:
        super().__init__(success_marker=success_marker, **kwargs)
        self.command = command
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.cpus_per_task = cpus_per_task
        self.time_hours = time_hours
        self.timeout_hours = timeout_hours
        self.max_gpus_per_node = max_gpus_per_node
        self.partition = partition
        self.account = account
        self.image = image
        self.container_mounts = list(container_mounts)
        # May be an XComArg (e.g. the NCCL probe's output): resolved when the template fields render.
        self.environment = environment if environment is not None else {}
        self.extra_sbatch = list(extra_sbatch)
        self.requeue = requeue
        self.pre_commands = list(pre_commands)
        self.post_commands = list(post_commands)
        self.leader_post_commands = list(leader_post_commands)
        self.inputs = list(inputs) if not isinstance(inputs, str) else [inputs]
        self.results_root = results_root
        self.log_dir = log_dir
        self.config_path = config_path
        self.secret_env = validate_secret_env(secret_env)
        self.exclude_nodes = list(exclude_nodes)
        self.sbatch_script = ""  # filled by render_template_fields: exactly what is submitted
        self._check_resources()

    def _check_resources(self) -> None:
        """Fail at DAG parse time for resource values (they are not templated)."""
        from npa_airflow.slurm.spec import SbatchSpec

        SbatchSpec(
            job_name="npa-parse-check-t1",
            command="true",
            log_dir="/npa/parse-check",
            results_dir="/npa/parse-check",
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            max_gpus_per_node=self.max_gpus_per_node,
            cpus_per_task=self.cpus_per_task,
            time_hours=self.time_hours,
            timeout_hours=self.timeout_hours,
            max_time_hours=None,
            requeue=self.requeue,
        )

    # -- spec and script ---------------------------------------------------------------------------------

    def _connection_config(self) -> Any:
        from airflow.sdk import BaseHook

        from npa_airflow.slurm.connection import SlurmConnectionConfig

        return SlurmConnectionConfig.from_connection(BaseHook.get_connection(self.slurm_conn_id))

    def build_spec(self, job_name: str, exclude_nodes: Sequence[str] = ()) -> Any:
        from npa_airflow.slurm.spec import SbatchSpec, normalize_storage_path

        cfg = self._connection_config()
        root = self.results_root or cfg.results_root
        if not root:
            raise NpaValidationError(
                f"results_root is not set and connection {self.slurm_conn_id!r} has no results_root extra: "
                "set one of them to an absolute path on the cluster's shared storage"
            )
        root = normalize_storage_path(root, "results_root").rstrip("/")
        results_dir = f"{root}/{job_name}"
        spec = SbatchSpec(
            job_name=job_name,
            command=self.command,
            log_dir=self.log_dir or f"{root}/slurm-logs",
            results_dir=results_dir,
            partition=self.partition or cfg.partition,
            account=self.account or cfg.account,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            max_gpus_per_node=self.max_gpus_per_node,
            cpus_per_task=self.cpus_per_task,
            time_hours=self.time_hours,
            timeout_hours=self.timeout_hours,
            max_time_hours=None,  # checked against the real partition's MaxTime before submitting
            image=self.image,
            container_mounts=tuple(self.container_mounts),
            environment=dict(self.environment) if isinstance(self.environment, Mapping) else self.environment,
            extra_sbatch=tuple(self.extra_sbatch),
            requeue=self.requeue,
            pre_commands=tuple(self.pre_commands),
            post_commands=tuple(self.post_commands),
            leader_post_commands=tuple(self.leader_post_commands),
            exclude_nodes=tuple(dict.fromkeys([*self.exclude_nodes, *exclude_nodes])),
            env_file=f"{root}/sidecars/{job_name}.env" if self.secret_env else None,
        )
        return spec.bind(config_path=self.config_path, job_id=job_name, results_dir=results_dir)

    def required_inputs(self) -> list[str]:
        from npa_airflow.slurm.spec import normalize_storage_path

        return [normalize_storage_path(p, f"inputs[{i}]") for i, p in enumerate(self.inputs)]

    def render_template_fields(self, context: Context, jinja_env: jinja2.Environment | None = None) -> None:
        super().render_template_fields(context, jinja_env)
        from npa_airflow.slurm.scripts import render_sbatch

        self.required_inputs()  # reject local/file:// inputs before the task does anything else
        self.sbatch_script = render_sbatch(self.build_spec(self.job_name_for_context(context)))

    def prepare_job(self, context: Context, job_name: str, exclude_nodes: Sequence[str]) -> PreparedJob:
        import shlex

        from npa_airflow.slurm.scripts import assert_script_clean, bash_syntax_check, render_sbatch
        from npa_airflow.slurm.staging import StagedFile

        spec = self.build_spec(job_name, exclude_nodes)
        script = render_sbatch(spec)
        secrets = _secret_env_values(self.secret_env) if self.secret_env else {}
        assert_script_clean(script, secrets.values())
        bash_syntax_check(script)
        files: list[Any] = []
        if secrets and spec.env_file:
            body = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(secrets.items()))
            files.append(StagedFile(spec.env_file, body.encode("utf-8"), 0o600))
        root = spec.results_dir.rsplit("/", 1)[0]
        return PreparedJob(
            job_name=job_name,
            script=script,
            script_path=f"{root}/sbatch/{job_name}.sbatch",
            results_dir=spec.results_dir,
            stdout_path=spec.stdout_path,
            stderr_path=spec.stderr_path,
            mkdirs=(*spec.log_dirs, spec.results_dir),
            required_paths=tuple(self.required_inputs()),
            files=tuple(files),
            wall_seconds=spec.time_minutes * 60,
            partition=spec.partition,
            time_minutes=spec.time_minutes,
            secret_values=tuple(secrets.values()),
        )

    def _show_submitted(self, job: PreparedJob) -> None:
        self.sbatch_script = job.script
