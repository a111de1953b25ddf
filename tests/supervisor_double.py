"""Test double for the triggerer's supervisor channel (`SUPERVISOR_COMMS`), the boundary a trigger's on_kill
reads the metadata database through. It answers GetTaskStates with a settable task state and keeps XComs in
a dict. The real channel is exercised by the e2e tests in a real Airflow (tests/e2e)."""

from __future__ import annotations

import types
from typing import Any


class SupervisorDouble:
    def __init__(self, state: str | None) -> None:
        self.state = state
        self.asked: list[Any] = []
        self.xcoms: dict[str, Any] = {}
        self.map_indexes: list[int] = []  # set: the task is mapped, answered as Airflow 3.3 does ("<task>_<i>")

    async def asend(self, msg: Any) -> Any:
        self.asked.append(msg)
        kind = type(msg).__name__
        if kind == "GetTaskStates":
            task = msg.task_ids[0]
            if self.map_indexes:
                wanted = self.map_indexes if msg.map_index is None else [msg.map_index]
                return types.SimpleNamespace(task_states={msg.run_ids[0]: {f"{task}_{i}": self.state for i in wanted}})
            return types.SimpleNamespace(task_states={msg.run_ids[0]: {task: self.state}})
        if kind == "SetXCom":
            self.xcoms[msg.key] = msg.value
            return None
        if kind == "GetXCom":
            return types.SimpleNamespace(key=msg.key, value=self.xcoms.get(msg.key))
        raise NotImplementedError(kind)


def install_supervisor(monkeypatch: Any, state: str | None, warmed: bool = True) -> SupervisorDouble:
    """Stand in for the triggerer's supervisor: the task instance's state reads as `state`.

    `warmed`: the process already made its one warm-up read (ownership.warm_task_reads), so what the double
    is asked is what on_kill asked, whichever test ran first in the process.
    """
    from airflow.sdk.execution_time import task_runner

    from npa_airflow.common import ownership

    double = SupervisorDouble(state)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", double, raising=False)
    monkeypatch.setattr(ownership, "_warm_up", ["warmed by an earlier trigger"] if warmed else [])
    return double


def run_for_task_instance(
    trigger: Any, try_number: int = 1, dag_id: str = "d", run_id: str = "r", map_index: int = -1
) -> Any:
    """As the triggerer runs a trigger: with the task instance it waits for."""
    trigger._task_instance = types.SimpleNamespace(
        dag_id=dag_id, task_id="t", run_id=run_id, map_index=map_index, try_number=try_number
    )
    return trigger
