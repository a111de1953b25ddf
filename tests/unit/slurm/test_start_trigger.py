"""SlurmStartTrigger's own decisions (the start, the wait and the end run for real in
tests/e2e/test_production_start_from_trigger.py): who starts a task instance, and what on_kill does before the job
exists."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from npa_airflow.common.log_delivery import AFTER_EVENT_SECONDS, LOG_DELIVERY_SECONDS
from npa_airflow.common.ownership import TaskView
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm import start_trigger
from npa_airflow.slurm.operators import SlurmSubmitOperator
from npa_airflow.slurm.operators.trigger_start import START_ON_WORKER
from npa_airflow.slurm.start_trigger import SlurmStartTrigger, in_thread, on_worker_reason

RESOURCES = {"partition": "cpu", "gpus_per_node": 0, "cpus_per_task": 1, "time_hours": 0.25}


def test_start_from_trigger_needs_the_deferrable_wait_and_is_refused_at_parse_without_it():
    with pytest.raises(NpaValidationError, match="needs deferrable=True"):
        SlurmSubmitOperator(task_id="t", command="true", deferrable=False, start_from_trigger=True, **RESOURCES)
    op = SlurmSubmitOperator(task_id="t", command="true", deferrable=True, start_from_trigger=True, **RESOURCES)
    assert op.start_from_trigger and op.start_trigger_args.next_method == "execute_complete"
    assert not SlurmSubmitOperator(task_id="u", command="true", **RESOURCES).start_from_trigger


def test_only_a_first_try_with_its_serialized_task_starts_in_the_triggerer():
    task = object()
    assert on_worker_reason(SimpleNamespace(task=task, try_number=1)) is None
    assert "try 2 starts on a worker" in on_worker_reason(SimpleNamespace(task=task, try_number=2))
    assert "no serialized task" in on_worker_reason(SimpleNamespace(task=None, try_number=1))
    assert on_worker_reason(None) is not None


def test_the_row_holds_nothing_and_the_schedulers_encoded_empty_kwargs_rebuild_it():
    # Airflow 3.3.2 stores StartTriggerArgs.trigger_kwargs={} read back from the serialized DAG in its encoded form
    trigger = SlurmStartTrigger(**{"__var": {}, "__type": "dict"})
    assert trigger.serialize() == ("npa_airflow.slurm.start_trigger.SlurmStartTrigger", {})


def test_a_start_handed_to_the_worker_runs_execute_there(monkeypatch):
    op = SlurmSubmitOperator(task_id="t", command="true", start_from_trigger=True, **RESOURCES)
    monkeypatch.setattr(op, "execute", lambda context: ("executed", context))
    assert op.execute_complete({"ti": 1}, {"status": START_ON_WORKER, "message": "try 2"}) == ("executed", {"ti": 1})


def test_in_thread_runs_off_the_loop_in_the_callers_context():
    import contextvars

    var = contextvars.ContextVar("npa_test_var", default="unset")

    async def main():
        var.set("the trigger's")
        return await in_thread(lambda: (var.get(), threading.current_thread().name))

    value, thread = asyncio.run(main())
    assert value == "the trigger's" and thread.startswith("npa-start")


class _Op:
    def __init__(self) -> None:
        self._this_try = object()
        self.killed = threading.Event()

    def on_kill(self) -> None:
        self.killed.set()


def _starting(monkeypatch, state: str | None) -> tuple[SlurmStartTrigger, _Op]:
    async def view(ti, **_):
        return TaskView(state)

    monkeypatch.setattr(start_trigger, "read_task_view", view)
    trigger = SlurmStartTrigger()
    trigger.task_instance = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1)
    trigger._op = op = _Op()
    return trigger, op


def test_a_user_ending_the_task_during_the_start_makes_the_operator_cancel_by_name(monkeypatch):
    trigger, op = _starting(monkeypatch, "failed")
    asyncio.run(trigger.on_kill())
    assert op.killed.is_set()


def test_a_trigger_moved_during_the_start_cancels_nothing(monkeypatch):
    monkeypatch.setattr(start_trigger, "decide", _decide_at_once)
    trigger, op = _starting(monkeypatch, "deferred")
    asyncio.run(trigger.on_kill())
    assert not op.killed.is_set()


async def _decide_at_once(observe, mine):
    from npa_airflow.common.ownership import kill_verdict

    current, task = await observe()
    return kill_verdict(mine, current, task)


def test_once_the_job_is_waited_on_its_wait_decides(monkeypatch):
    calls = []

    class Wait:
        async def on_kill(self) -> None:
            calls.append("wait")

    trigger, op = _starting(monkeypatch, "failed")
    trigger._wait = Wait()
    asyncio.run(trigger.on_kill())
    asyncio.run(trigger.on_kill())  # Airflow may call it again: once
    assert calls == ["wait"] and not op.killed.is_set()


def test_the_hooks_commands_in_a_start_thread_run_on_the_triggerers_loop():
    """The sync hook's run_sync lands on the loop that started the thread: the start shares that loop's SSH
    connections (the poller's) instead of opening its own on the private background loop."""
    from npa_airflow.common.background_loop import run_sync

    async def loop_of() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    async def main():
        return asyncio.get_running_loop(), await in_thread(lambda: run_sync(loop_of()))

    caller, used = asyncio.run(main())
    assert used is caller
    assert run_sync(loop_of()) is not caller  # outside a start thread: the private background loop


def test_the_job_s_wait_leaves_the_log_lines_to_the_start_trigger_which_waits_once_after_the_completion():
    seen = []

    class Wait:
        delivers_log_lines = True

        async def run(self):
            seen.append(self.delivers_log_lines)
            yield SimpleNamespace(payload={"status": "failed", "message": "exit 3"})

    trigger = SlurmStartTrigger()
    trigger._wait = Wait()
    event = asyncio.run(trigger._wait_and_end(SimpleNamespace(), {}))
    assert seen == [False] and event.payload["status"] == "failed"


@pytest.mark.parametrize("path", ["on a worker", "ended here"])
def test_the_event_waits_for_the_log_lines_before_and_airflows_line_after_it_on_either_path(monkeypatch, path):
    steps = []

    async def until_read(timeout=LOG_DELIVERY_SECONDS):
        steps.append(("wait", timeout))
        return 0.0

    async def run_here(call, *args):
        return call(*args)

    async def wait_and_end(self, ti, context):
        return SimpleNamespace(payload={"status": "success"})

    op = SimpleNamespace(start_job=lambda *args: object(), job_name_for_context=lambda context: "name")
    monkeypatch.setattr(start_trigger, "until_log_lines_read", until_read)
    monkeypatch.setattr(start_trigger, "in_thread", run_here)
    monkeypatch.setattr(start_trigger, "rebuild", lambda ti: (op, {}))
    monkeypatch.setattr(SlurmStartTrigger, "_wait_and_end", wait_and_end)
    why = "try 2 starts on a worker" if path == "on a worker" else None
    monkeypatch.setattr(start_trigger, "on_worker_reason", lambda ti: why)

    async def events():
        async for event in SlurmStartTrigger().run():
            steps.append(("event", event.payload["status"]))

    asyncio.run(events())
    ending = START_ON_WORKER if path == "on a worker" else "success"
    assert steps == [("wait", LOG_DELIVERY_SECONDS), ("event", ending), ("wait", AFTER_EVENT_SECONDS)]
