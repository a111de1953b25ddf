"""SlurmStartTrigger: a Slurm task started, waited on and (when its job succeeds) ended in the triggerer.

The scheduler defers a task with `start_from_trigger=True` straight to this trigger (its row holds no kwargs). The
trigger rebuilds the operator from the serialized task (`npa_airflow.common.serialized_tasks`), renders its
templates with the task instance's context, and runs the worker's start, `start_job` (checks, adopt or submit over
the cluster's pooled connection, the handle and the try to XCom), in a thread: the hook's calls and Airflow's
supervisor calls are synchronous there. It then waits with the `SlurmJobTrigger` that start returned, through the
cluster's one poller, and on success runs `execute_complete` in the thread too and ends the task with
`TaskSuccessEvent` (its return value as XCom). Any other end resumes the task on a worker with the wait's event,
exactly as a deferred task does; a start it cannot do here goes to a worker with a `start_on_worker` event.

A user's action (mark failed or success, clear) while the job is submitted is seen by `on_kill` as for any Slurm
trigger: the task instance is no longer deferred. Before the job has an id, the operator's own `on_kill` cancels it
by its exact name (and the sbatch still running cancels its own job when it returns); a trigger that only moved to
another triggerer cancels nothing, and the one that takes over adopts the job by name.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from npa_airflow.common.background_loop import calls_on
from npa_airflow.common.coalesce import InFlight
from npa_airflow.common.configured_hook import shared_configs
from npa_airflow.common.log_delivery import AFTER_EVENT_SECONDS, until_log_lines_read
from npa_airflow.common.ownership import Verdict, decide, read_task_view, shielded
from npa_airflow.slurm.operators.trigger_start import START_ON_WORKER

T = TypeVar("T")
START_THREADS = 16  # starts and completions in flight at once per triggerer (each mostly waits on the cluster)
ON_KILL_TIMEOUT = 25.0  # inside the triggerer's own bound on on_kill (30 s)
# The upstream output a mapped task expands over: every map index reads the same value, each read a round trip
# to the triggerer's supervisor, which serves them one at a time between its database work. Starts that ask
# while one read runs share it.
_UPSTREAM_READS: InFlight[tuple[str, str, str, str], Any] = InFlight()


@functools.cache
def _threads() -> ThreadPoolExecutor:
    """The triggerer's start threads, made at the first start (only its event loop's thread asks)."""
    return ThreadPoolExecutor(START_THREADS, thread_name_prefix="npa-start")


async def in_thread(call: Callable[..., T], *args: Any) -> T:
    """Run the synchronous `call` on the start threads, in this task's context (its log lines go to the task's
    log, as the trigger's own do), its hook's commands on this loop (the poller's SSH connection, no other), its
    connection's config shared with the other starts (`shared_configs`)."""
    loop, context = asyncio.get_running_loop(), contextvars.copy_context()

    def on_this_loop() -> T:
        with calls_on(loop), shared_configs():
            return call(*args)

    return await loop.run_in_executor(_threads(), functools.partial(context.run, on_this_loop))


def on_worker_reason(ti: Any) -> str | None:
    """Why a worker must start this task instance, or None when the triggerer can."""
    if ti is None or getattr(ti, "task", None) is None:
        return "the triggerer has no serialized task for it"
    if int(getattr(ti, "try_number", None) or 1) > 1:
        return f"try {ti.try_number} starts on a worker (it looks up the earlier tries' jobs and bad nodes there)"
    return None


def rebuild(ti: Any) -> tuple[Any, dict[str, Any]]:
    """The task's operator, rendered for `ti`, and its template context (raises NotRebuildable, or the refusal
    of a bad value)."""
    # run-time only: the triggerer
    from airflow.sdk.definitions._internal.templater import create_template_env

    from npa_airflow.common.serialized_tasks import NotRebuildable, operator_kwargs, task_class

    task = ti.task
    cls = task_class(task)
    if not hasattr(cls, "start_job"):
        raise NotRebuildable(f"{cls.__name__} does not start in the triggerer")

    def upstream_xcom(task_id: str, key: str) -> Any:
        def read() -> Any:
            return ti.xcom_pull(task_ids=task_id, key=key, map_indexes=-1)

        return _UPSTREAM_READS.get((ti.dag_id, ti.run_id, task_id, key), read)

    kwargs = operator_kwargs(task, cls, upstream_xcom, getattr(ti, "map_index", None))
    op = cls(task_id=ti.task_id, **kwargs)
    context = ti.get_template_context()
    ti.task = context["task"] = op  # the operator's own code reads its fields through the context
    # The triggerer's supervisor does not serve the task state store (Airflow 3.3.2: a request waits forever).
    # Only the first try starts here, and a first try has no bad nodes carried from an earlier one.
    context.pop("task_state_store", None)
    op.render_template_fields(context, create_template_env())
    return op, context


class SlurmStartTrigger(BaseTrigger):
    """Start the task instance's Slurm job here, wait for it, and end the task on success (module docstring)."""

    def __init__(self, **_: Any) -> None:
        super().__init__()
        self._op: Any = None
        self._wait: Any = None  # the SlurmJobTrigger of the job, once submitted
        self._killed = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ti = getattr(self, "task_instance", None)
        why = on_worker_reason(ti)
        try:
            if why is None:
                self._op, context = await in_thread(rebuild, ti)
                self._op._log = self.log  # its lines in the task's log, beside the trigger's
                self._wait = await in_thread(
                    self._op.start_job, context, self._op.job_name_for_context(context), None, None
                )
        except Exception as exc:  # the worker starts it: the same checks there fail or retry the task as usual
            why = f"the triggerer could not start it: {type(exc).__name__}: {exc}"
        if why is not None or self._wait is None:
            self.log.info("Starting on a worker: %s", why)
            event = TriggerEvent({"status": START_ON_WORKER, "message": why})
        else:
            event = await self._wait_and_end(ti, context)
        await until_log_lines_read()  # the start's lines and the completion's
        yield event
        await until_log_lines_read(AFTER_EVENT_SECONDS)  # Airflow's "Trigger fired event" line

    async def _wait_and_end(self, ti: Any, context: dict[str, Any]) -> TriggerEvent:
        """Wait for the job; end the task here on success, else hand the event to a worker."""
        wait = self._wait
        wait.task_instance, wait.trigger_id = ti, getattr(self, "trigger_id", None)
        wait.delivers_log_lines = False  # the lines wait once, with the completion's, before this trigger's event
        payload: dict[str, Any] = {}
        async for event in wait.run():
            payload = event.payload
        if payload.get("status") != "success":
            return TriggerEvent(payload)
        try:
            result = await in_thread(self._op.execute_complete, context, payload)
        except Exception as exc:  # the worker completes it from the same event
            failure = f"{type(exc).__name__}: {exc}"
            self.log.warning("Completing in the triggerer failed (%s); a worker completes the task", failure)
            return TriggerEvent(payload)
        return TaskSuccessEvent(xcoms={"return_value": result} if result is not None else None)

    async def on_kill(self) -> None:
        """A user ended the task, or the trigger moved: the job's wait decides once it exists; before, the task
        instance's state does, and the operator cancels what it has submitted by its name."""
        if self._killed:
            return
        self._killed = True
        if self._wait is not None:
            await self._wait.on_kill()
            return
        if self._op is None or getattr(self._op, "_this_try", None) is None:
            return  # nothing submitted: the task is not started yet
        try:
            await shielded(asyncio.wait_for(self._cancel_start_unless_moved(), ON_KILL_TIMEOUT))
        except Exception as exc:
            self.log.error("Could not cancel the job being submitted: %s", str(exc) or type(exc).__name__)

    async def _cancel_start_unless_moved(self) -> None:
        ti = getattr(self, "task_instance", None)

        async def observe() -> tuple[None, Any]:
            return None, await read_task_view(ti)

        verdict, why = await decide(observe, None)
        if verdict is not Verdict.CANCEL:
            self.log.info("Not cancelling the job being submitted (%s): %s", verdict.value, why)
            return
        self.log.info("Cancelling the job being submitted: %s", why)
        await in_thread(self._op.on_kill)
