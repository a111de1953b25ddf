"""Whether a trigger's `on_kill` may cancel its job: a move to another triggerer never does.

Airflow 3.3.2 cancels a trigger with the same "user action" message whether a user acted on the task (mark
failed or success, clear, the run set to failed) or the trigger only moved to another triggerer:
`TriggerRunnerSupervisor.update_triggers` cancels every trigger no longer assigned to this triggerer, and a
triggerer whose heartbeat lapsed (a stall, a slow database) loses all of its triggers. The message says
nothing, so `on_kill` decides from two facts instead:

- the task instance in the metadata database, read through the triggerer's execution API: a try that is no
  longer DEFERRED was ended by a user or the scheduler; a DEFERRED one is still waiting (on another triggerer);
- the claim: each trigger that starts watching a job records (try, token), for Slurm next to the job's log
  offsets on the cluster (`npa_airflow.slurm.watch.poller`), for Burst in an XCom of the task instance; a claim by
  another trigger of the same try means this one was moved; a claim by a later try means the task was
  cleared and started again (a clear still cancels, as it always has).

A move never cancels. When neither fact settles it within the bound, nothing is cancelled and the reason is
logged (a user's action is also seen by the listener in `npa_airflow.plugin`, which cancels from the API server).

Airflow 3.3.2 also cancels the trigger's task again at every loop of its trigger runner (about once a second)
while `on_kill` runs, which would cut the decision short; `shielded` lets it finish within its own bound.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.comms import GetTaskStates, GetXCom, SetXCom

from npa_airflow.common import xcom_keys
from npa_airflow.common.coalesce import Coalescer
from npa_airflow.common.retry import apause

log = logging.getLogger(__name__)
DECIDE_SECONDS = 12.0  # how long on_kill (Slurm's and Burst's) keeps reading before it leaves the job alone
DECIDE_PAUSE = 1.0
READ_TIMEOUT = 10.0
DEFERRED = "deferred"
_warm_up: list[asyncio.Task[Any]] = []  # this process's one warm-up request, kept referenced
_in_flight: set[asyncio.Future[Any]] = set()  # shielded on_kill work, kept referenced until it ends


@dataclass(frozen=True)
class Claim:
    """One trigger's claim on a job: the try it waits for and a token unique to this trigger instance."""

    try_number: int
    token: str

    @classmethod
    def new(cls, try_number: int) -> Claim:
        return cls(int(try_number), uuid.uuid4().hex[:16])

    def line(self) -> str:
        return f"{self.try_number} {self.token}"

    @classmethod
    def parse(cls, text: str | bytes | None) -> Claim | None:
        """The claim in a claim file's first line; None for an empty or damaged file."""
        if isinstance(text, bytes):
            text = text.decode("ascii", errors="replace")
        parts = (text or "").split()
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isalnum():
            return None
        return cls(int(parts[0]), parts[1])


@dataclass(frozen=True)
class TaskView:
    """The task instance as the metadata database has it now (`state` None: no state, e.g. just cleared), and
    the try that last reached its job, when the operator records it (None: unknown)."""

    state: str | None
    waiting_try: int | None = None


class Verdict(enum.Enum):
    CANCEL = "cancel"
    MOVED = "moved"
    UNDECIDED = "undecided"


def kill_verdict(mine: Claim | None, current: Claim | None, task: TaskView | None) -> tuple[Verdict, str]:
    """Decide from what was read; `current` None: no claim readable, `task` None: the state could not be read."""
    if mine is not None and current is not None and current.token != mine.token:
        if current.try_number == mine.try_number:
            return Verdict.MOVED, f"another trigger of try {current.try_number} has claimed the job"
        if current.try_number > mine.try_number:
            return Verdict.CANCEL, f"try {current.try_number} has claimed the job: try {mine.try_number} was cleared"
    if task is not None and mine is not None and task.waiting_try is not None and task.waiting_try > mine.try_number:
        return Verdict.CANCEL, f"try {task.waiting_try} has started: try {mine.try_number} was cleared"
    if task is not None and task.state != DEFERRED:
        return Verdict.CANCEL, f"the task instance is {task.state or 'cleared (no state)'}"
    if task is None:
        return Verdict.UNDECIDED, "the task instance's state could not be read"
    return Verdict.UNDECIDED, "the task instance is still deferred (the trigger may have moved)"


async def decide(
    observe: Callable[[], Awaitable[tuple[Claim | None, TaskView | None]]],
    mine: Claim | None,
    bound: float | None = None,
    pause: float | None = None,
) -> tuple[Verdict, str]:
    """Observe until the verdict is CANCEL or MOVED, or `bound` seconds pass (then UNDECIDED)."""
    pause = DECIDE_PAUSE if pause is None else pause
    end = time.monotonic() + (DECIDE_SECONDS if bound is None else bound)
    while True:
        current, task = await observe()
        verdict, why = kill_verdict(mine, current, task)
        if verdict is not Verdict.UNDECIDED or time.monotonic() + pause > end:
            return verdict, why
        await apause(pause)


def _comms() -> Any:
    """The triggerer's channel to its supervisor (AttributeError outside a triggerer, e.g. dag.test())."""
    return task_runner.SUPERVISOR_COMMS


def _map_index(ti: Any) -> int | None:
    """The task instance's map index, None for an unmapped one (as GetTaskStates takes it)."""
    return ti.map_index if getattr(ti, "map_index", None) is not None and ti.map_index >= 0 else None


def _xcom_map_index(ti: Any) -> int:
    """The map index as XCom requests take it: -1 for an unmapped task instance."""
    index = _map_index(ti)
    return -1 if index is None else index


async def read_task_view(ti: Any, timeout: float = READ_TIMEOUT, try_keys: Sequence[str] = ()) -> TaskView | None:
    """The current state of trigger's task instance `ti` (a TaskInstanceDTO), through the triggerer's
    supervisor, and the try number the operator last pushed under the first of the XCom `try_keys` that holds one,
    as a number or as the `waiting_try` of a handle (read only while the task is deferred: any other state decides
    on its own); None when there is no supervisor (dag.test) or the read fails. Reads of the same task's instances
    that arrive together share one request."""
    if ti is None:
        return None
    key = _TaskKey(ti.dag_id, ti.run_id, ti.task_id, _map_index(ti))
    try:
        found = await asyncio.wait_for(_task_state_reads().get(key), timeout)
    except Exception:
        return None
    if found is None:
        return None
    state = found[0]
    for try_key in try_keys if state == DEFERRED else ():
        waiting_try = _try_number(await read_xcom(ti, try_key, timeout))
        if waiting_try is not None:
            return TaskView(state, waiting_try)
    return TaskView(state)


def _try_number(value: Any) -> int | None:
    """A try number as an XCom holds it: the number (or its digits), or a handle's `waiting_try`."""
    if isinstance(value, Mapping):
        value = value.get("waiting_try")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class _TaskKey:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int | None


_STATE_READS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Coalescer[_TaskKey, tuple[str | None]]] = (
    weakref.WeakKeyDictionary()
)


def _task_state_reads() -> Coalescer[_TaskKey, tuple[str | None]]:
    loop = asyncio.get_running_loop()
    reads = _STATE_READS.get(loop)
    if reads is None:
        reads = _STATE_READS[loop] = Coalescer(_read_task_states)
    return reads


async def _read_task_states(keys: Sequence[_TaskKey]) -> dict[_TaskKey, tuple[str | None]]:
    """ONE GetTaskStates per (DAG, run, task) for all its map indexes asked: {key: (state,)}, unread keys left out.

    One task id per request: Airflow 3.3 answers a mapped instance as "<task_id>_<map_index>", which two task
    ids of one request could both produce.
    """
    groups: dict[tuple[str, str, str], list[_TaskKey]] = {}
    for key in keys:
        groups.setdefault((key.dag_id, key.run_id, key.task_id), []).append(key)
    found: dict[_TaskKey, tuple[str | None]] = {}
    for (dag_id, run_id, task_id), members in groups.items():
        map_index = members[0].map_index if len(members) == 1 else None
        request = GetTaskStates(dag_id=dag_id, task_ids=[task_id], run_ids=[run_id], map_index=map_index)
        try:
            response = await _comms().asend(request)
        except Exception as exc:  # this group reads as unknown; the others may still answer
            log.warning("Could not read the states of %s in %s/%s: %s", task_id, dag_id, run_id, exc)
            continue
        states = (getattr(response, "task_states", None) or {}).get(run_id) or {}
        for key in members:
            state = _state_in(states, task_id, key.map_index)
            if state is not _MISSING:
                found[key] = (state,)  # type: ignore[assignment]
    return found


_MISSING = object()


def _state_in(states: dict[str, Any], task_id: str, map_index: int | None) -> Any:
    """A task instance's state in GetTaskStates' answer for its run: {task_id: state} for an unmapped one,
    {"<task_id>_<map_index>": state} for a mapped one (or {task_id: {map_index: state}})."""
    if map_index is None:
        value = states.get(task_id, _MISSING)
        return _MISSING if isinstance(value, dict) else value
    if f"{task_id}_{map_index}" in states:
        return states[f"{task_id}_{map_index}"]
    nested = states.get(task_id)
    if isinstance(nested, dict):
        return nested.get(map_index, nested.get(str(map_index), _MISSING))
    return _MISSING


async def shielded(work: Awaitable[Any]) -> Any:
    """Await `work` so that cancelling the caller (Airflow re-cancels a trigger while its on_kill runs) does not
    cancel `work`: it goes on in the background until it ends by itself."""
    task = asyncio.ensure_future(work)
    _in_flight.add(task)
    task.add_done_callback(_in_flight.discard)
    return await asyncio.shield(task)


def warm_task_reads(ti: Any) -> None:
    """Make the triggerer's first execution-API request now, in the background, not in on_kill.

    Airflow 3.3.2 builds the triggerer's in-process execution API on its first request, and its supervisor
    does nothing else meanwhile (measured here: 4.7 s on an idle machine, 13 s under load, heartbeat
    included). Paid when a trigger starts, on_kill's reads are answered in milliseconds.
    """
    if ti is None or _warm_up:
        return
    _warm_up.append(asyncio.get_running_loop().create_task(read_task_view(ti, timeout=120)))


async def write_claim_xcom(ti: Any, claim: Claim, timeout: float = 60.0) -> bool:
    """Record `claim` as the task instance's XCom TRIGGER_CLAIM; False when there is no supervisor or it failed."""
    return await write_xcom(ti, xcom_keys.TRIGGER_CLAIM, claim.line(), timeout)


async def write_xcom(ti: Any, key: str, value: Any, timeout: float = 60.0) -> bool:
    """Set the task instance's XCom `key` from the triggerer; False when there is no supervisor or it failed."""
    if ti is None:
        return False
    try:
        request = SetXCom(
            key=key,
            value=value,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            map_index=_xcom_map_index(ti),
        )
        await asyncio.wait_for(_comms().asend(request), timeout)
    except Exception:
        return False
    return True


async def read_xcom(ti: Any, key: str, timeout: float = READ_TIMEOUT) -> Any:
    """The value of the task instance's XCom `key` (None when absent or unreadable)."""
    try:
        request = GetXCom(
            key=key,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            task_id=ti.task_id,
            map_index=_xcom_map_index(ti),
        )
        response = await asyncio.wait_for(_comms().asend(request), timeout)
    except Exception:
        return None
    return getattr(response, "value", None)


async def read_claim_xcom(ti: Any, timeout: float = READ_TIMEOUT) -> Claim | None:
    """The claim now in the task instance's XCom TRIGGER_CLAIM; None when absent or unreadable."""
    if ti is None:
        return None
    value = await read_xcom(ti, xcom_keys.TRIGGER_CLAIM, timeout)
    return Claim.parse(value) if isinstance(value, str) else None


async def claim_xcom_is(ti: Any, claim: Claim) -> bool:
    """Whether `claim` is still the task instance's current claim; an unreadable claim counts as current."""
    current = await read_claim_xcom(ti)
    return current is None or current.token == claim.token
