"""SlurmJobTrigger: persistence round trip, events, live log lines, deadline, on_kill guards.

Job states come from `LocalClusterDouble` (test double for SlurmHook at the boundary, tests/harness/cluster_double.py);
log files are real files read by the real tail/offsets shell commands in local bash.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest
from airflow.models.trigger import Trigger

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands import JobUsage
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.triggers import (
    SlurmJobTrigger,
    event_handle,
    make_event_payload,
    validate_event,
)
from npa_airflow.slurm.watch.poller import get_poller, offsets_file_for, reset_pollers
from npa_airflow.slurm.watch.trigger_events import ENDED_FIRST, event_usage, usage_line
from tests.harness.cluster_double import LocalClusterDouble
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = pytest.mark.usefixtures("fast_poller")  # tests/unit/slurm/conftest.py

LOGGER = "npa.test.trigger"  # Airflow's structlog logger is swapped for a stdlib one that caplog sees


def handle_for(tmp_path: Path, job_id: str = "42", **overrides) -> dict:
    handle = {
        "conn_id": "slurm_test",
        "cluster": None,
        "job_id": job_id,
        "job_name": "npa-dag-task-abc1234567-t1",
        "login_host": "127.0.0.1:2222",
        "results_dir": str(tmp_path / "results"),
        "stdout_path": str(tmp_path / f"slurm-{job_id}.out"),
        "stderr_path": str(tmp_path / f"slurm-{job_id}.err"),
        "try_number": 1,
        "retry_of": None,
        "submitted_at": time.time() - 3600,
    }
    handle.update(overrides)
    return handle


@pytest.fixture
def double() -> LocalClusterDouble:
    return LocalClusterDouble()


def make_trigger(handle: dict, double: LocalClusterDouble, **kwargs) -> SlurmJobTrigger:
    trigger = SlurmJobTrigger(handle=handle, conn_id="slurm_test", poll_interval=0.01, **kwargs)
    trigger._log = logging.getLogger(LOGGER)
    return trigger


async def first_event(trigger: SlurmJobTrigger, double: LocalClusterDouble, timeout: float = 10):
    get_poller("slurm_test", lambda _: double)
    gen = trigger.run()
    try:
        return await asyncio.wait_for(anext(gen), timeout)
    finally:
        await gen.aclose()


def logged_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def test_serialize_round_trip_through_the_trigger_table(tmp_path):
    trigger = SlurmJobTrigger(
        handle=handle_for(tmp_path),
        conn_id="slurm_x",
        poll_interval=7,
        deadline=1_900_000_000.5,
        require_marker="status.json",
        log_offsets={"/a/b.out": 12},
        stream_logs=False,
        cancel_on_kill=False,
    )
    row = Trigger.from_object(trigger)
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    cls = TriggerRunner().get_trigger_by_classpath(row.classpath)
    rebuilt = cls(**row.kwargs)
    assert rebuilt.serialize() == trigger.serialize()
    classpath, kwargs = trigger.serialize()
    assert classpath == "npa_airflow.slurm.triggers.SlurmJobTrigger"
    import inspect

    # log_offsets is accepted (rows of earlier versions carry it) but no longer serialised
    assert set(kwargs) == set(inspect.signature(SlurmJobTrigger.__init__).parameters) - {"self", "log_offsets"}


def test_the_trigger_holds_a_typed_handle_and_its_row_keeps_the_dict_it_was_given(tmp_path):
    given = {**handle_for(tmp_path), "script_path": "/shared/results/sbatch/job.sbatch"}  # as the operator writes it
    trigger = SlurmJobTrigger(handle=given, conn_id="slurm_x")
    assert isinstance(trigger.handle, SlurmJobHandle) and trigger.handle.job_id == "42"
    assert trigger.serialize()[1]["handle"] == given


def test_a_handle_from_a_trigger_row_is_validated_like_a_new_one(tmp_path):
    with pytest.raises(NpaValidationError, match="job_id"):
        SlurmJobTrigger(handle=handle_for(tmp_path, job_id="42; scancel -u x"), conn_id="slurm_x")
    with pytest.raises(NpaValidationError, match="unknown keys"):
        SlurmJobTrigger(handle={**handle_for(tmp_path), "shred": ["/etc/passwd"]}, conn_id="slurm_x")


async def test_a_trigger_row_of_an_earlier_release_still_runs(tmp_path, double):
    """A row written before the handle named its script and sidecar rebuilds, waits and fires its event."""
    kwargs = {"handle": handle_for(tmp_path), "conn_id": "slurm_test", "poll_interval": 0.01, "log_offsets": {}}
    trigger = SlurmJobTrigger(**kwargs)
    trigger._log = logging.getLogger(LOGGER)
    double.states["42"] = JobState.COMPLETE
    event = await first_event(trigger, double)
    assert validate_event(event.payload)["status"] == "success"
    assert event_handle(event.payload) == SlurmJobHandle.from_dict(kwargs["handle"])


def test_trigger_rejects_handle_without_job_id():
    with pytest.raises(ValueError, match="job_id"):
        SlurmJobTrigger(handle={"job_name": "x"}, conn_id="c")


def test_event_validation(tmp_path):
    handle = handle_for(tmp_path)
    good = make_event_payload("success", handle, "done")
    assert validate_event(good) is good
    with pytest.raises(ValueError, match="must be a dict"):
        validate_event("success")
    with pytest.raises(ValueError, match="lacks"):
        validate_event({"status": "success"})
    with pytest.raises(ValueError, match="unknown status 'weird'"):
        validate_event({**good, "status": "weird"})
    with pytest.raises(ValueError, match="does not match job"):
        validate_event({**good, "job_id": "43"})
    with pytest.raises(ValueError, match="unknown Slurm trigger event status"):
        make_event_payload("nope", handle, "x")


async def test_success_streams_lines_in_order_then_fires(tmp_path, double, caplog):
    caplog.set_level(logging.INFO)
    handle = handle_for(tmp_path)
    Path(handle["stdout_path"]).write_bytes(b"step 1\nstep 2\npart")
    Path(handle["stderr_path"]).write_bytes(b"warn: x\n")
    double.states["42"] = JobState.RUNNING
    trigger = make_trigger(handle, double)
    get_poller("slurm_test", lambda _: double)
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))
    for _ in range(200):
        if "step 2" in logged_lines(caplog):
            break
        await asyncio.sleep(0.01)
    assert not task.done()
    with open(handle["stdout_path"], "ab") as f:
        f.write(b"ial line\nlast")
    await asyncio.sleep(0.1)
    double.states["42"] = JobState.COMPLETE
    event = await asyncio.wait_for(task, 10)
    await gen.aclose()
    assert event.payload["status"] == "success"
    lines = [line for line in logged_lines(caplog) if not line.startswith(("Waiting", "Slurm job"))]
    assert lines == ["step 1", "step 2", "[stderr] warn: x", "partial line", "last"]
    assert event.payload["log_offsets"] == {
        handle["stdout_path"]: len(b"step 1\nstep 2\npartial line\nlast"),
        handle["stderr_path"]: len(b"warn: x\n"),
    }
    validate_event(event.payload)


async def test_failure_event_carries_exit_code_and_log_tail(tmp_path, double):
    handle = handle_for(tmp_path, stderr_path=str(tmp_path / "slurm-42.out"))
    Path(handle["stdout_path"]).write_bytes(b"loading\nTraceback: boom\n")
    double.states["42"] = JobState.ERROR
    event = await first_event(make_trigger(handle, double), double)
    assert event.payload["status"] == "failed"
    assert event.payload["native_state"] == "FAILED"
    assert event.payload["log_tail"].endswith("Traceback: boom")


async def test_the_end_event_carries_the_jobs_usage_success_and_failure_alike(tmp_path, double):
    for state, status in ((JobState.COMPLETE, "success"), (JobState.ERROR, "failed")):
        double.states["42"] = state
        double.usage["42"] = JobUsage(gpus=16, nodes=2, elapsed_seconds=480)
        event = await first_event(make_trigger(handle_for(tmp_path), double), double)
        assert event.payload["status"] == status
        assert event.payload["usage"] == {"gpus": 16, "nodes": 2, "elapsed_seconds": 480, "gpu_hours": 16 * 480 / 3600}
        assert "usage_unknown" not in event.payload
        validate_event(event.payload)
        reset_pollers()


@pytest.mark.parametrize(
    ("accounting", "why"),
    [(False, "the cluster keeps no accounting"), (True, "accounting has no record of the job's allocation")],
)
async def test_an_end_without_accounting_s_record_says_why_its_usage_is_unknown(tmp_path, double, accounting, why):
    double.states["42"], double.accounting = JobState.COMPLETE, accounting
    event = await first_event(make_trigger(handle_for(tmp_path), double), double)
    assert (event.payload["usage"], event.payload["usage_unknown"]) == (None, why)


async def test_a_wait_that_ends_before_the_job_tells_no_usage(tmp_path, double):
    double.states["42"] = JobState.RUNNING
    double.usage["42"] = JobUsage(gpus=8, nodes=1, elapsed_seconds=30)  # so far: the job goes on until cancelled
    trigger = make_trigger(handle_for(tmp_path), double, deadline=time.time() + 0.3)
    event = await first_event(trigger, double)
    assert event.payload["status"] == "deadline"
    assert (event.payload["usage"], event.payload["usage_unknown"]) == (None, ENDED_FIRST)


@pytest.mark.parametrize(
    ("usage", "line"),
    [
        (JobUsage(16, 2, 480), "GPU usage: 2.13 GPU-hours (16 GPUs on 2 nodes x 8 min 0 s)"),
        (JobUsage(1, 1, 20), "GPU usage: 0.01 GPU-hours (1 GPU on 1 node x 20 s)"),
        (JobUsage(0, 1, 93784), "GPU usage: 0.00 GPU-hours (0 GPUs on 1 node x 26 h 3 min 4 s)"),
    ],
)
def test_the_usage_line(usage, line):
    assert usage_line(usage, "") == line


def test_an_events_usage_is_read_back_checked():
    assert event_usage({"usage": JobUsage(16, 2, 480).to_dict()}) == (JobUsage(16, 2, 480), "")
    assert event_usage({"usage": None, "usage_unknown": "the cluster keeps no accounting"}) == (
        None, "the cluster keeps no accounting",
    )  # fmt: skip
    for bad in ({"gpus": "16", "nodes": 2, "elapsed_seconds": 1}, {"gpus": -1, "nodes": 2, "elapsed_seconds": 1}):
        assert event_usage({"usage": bad}) == (None, "the wait reported none")
    assert event_usage({}) == (None, "the wait reported none")  # an event of an earlier release
    assert usage_line(None, "the cluster keeps no accounting") == "GPU usage: unknown (the cluster keeps no accounting)"


async def test_cancelled_outside_is_reported_as_canceled(tmp_path, double):
    double.states["42"] = JobState.CANCELED
    event = await first_event(make_trigger(handle_for(tmp_path), double), double)
    assert event.payload["status"] == "canceled"


async def test_required_marker(tmp_path, double):
    handle = handle_for(tmp_path)
    double.states["42"] = JobState.COMPLETE
    missing = await first_event(make_trigger(handle, double, require_marker="status.json"), double)
    assert missing.payload["status"] == "marker_missing"
    assert missing.payload["marker"] == f"{handle['results_dir']}/status.json"
    Path(handle["results_dir"]).mkdir()
    Path(handle["results_dir"], "status.json").write_text("{}")
    found = await first_event(make_trigger(handle, double, require_marker="status.json"), double)
    assert found.payload["status"] == "success"


async def test_jobs_that_end_in_the_same_cycle_share_one_success_marker_check(tmp_path, double):
    get_poller("slurm_test", lambda _: double)
    triggers = []
    for job_id in ("41", "42", "43"):
        handle = handle_for(tmp_path, job_id, results_dir=str(tmp_path / f"results-{job_id}"))
        Path(handle["results_dir"]).mkdir()
        Path(handle["results_dir"], "status.json").write_text("{}")
        double.states[job_id] = JobState.COMPLETE
        triggers.append(make_trigger(handle, double, require_marker="status.json"))
    events = await asyncio.gather(*(first_event(t, double) for t in triggers))
    assert [e.payload["status"] for e in events] == ["success"] * 3
    assert [len(paths) for paths in double.path_checks] == [3]


async def test_unknown_state_waits_until_the_deadline(tmp_path, double):
    double.fail_states = 10**6  # the cluster never answers
    trigger = make_trigger(handle_for(tmp_path), double, deadline=time.time() + 0.5)
    event = await first_event(trigger, double)
    assert event.payload["status"] == "deadline"
    assert len(double.state_calls) >= 1  # it kept trying rather than guessing


async def test_the_trigger_cancels_the_job_itself_when_its_deadline_passes(tmp_path, double):
    """execution_timeout / max_wait: the job is cancelled in the triggerer, before the task resumes."""
    double.states["42"] = JobState.RUNNING
    trigger = make_trigger(handle_for(tmp_path), double, deadline=time.time() + 0.3)
    event = await first_event(trigger, double)
    assert event.payload["status"] == "deadline"
    assert double.states["42"] is JobState.CANCELED


async def test_restart_does_not_replay_logged_lines(tmp_path, double, caplog):
    caplog.set_level(logging.INFO)
    handle = handle_for(tmp_path, stderr_path=str(tmp_path / "slurm-42.out"))
    out = Path(handle["stdout_path"])
    out.write_bytes(b"a\nb\n")
    double.states["42"] = JobState.RUNNING
    first = make_trigger(handle, double)
    get_poller("slurm_test", lambda _: double)
    gen = first.run()
    task = asyncio.ensure_future(anext(gen))
    for _ in range(200):
        if "b" in logged_lines(caplog):
            break
        await asyncio.sleep(0.01)
    task.cancel()  # the triggerer stops: no event, cleanup() keeps the position
    with pytest.raises(asyncio.CancelledError):
        await task
    await gen.aclose()
    await first.cleanup()
    assert json.loads(Path(offsets_file_for(str(out))).read_text()) == {str(out): 4}

    reset_pollers()  # a new triggerer process, with the trigger rebuilt from its original kwargs
    out.write_bytes(b"a\nb\nc\n")
    double.states["42"] = JobState.COMPLETE
    caplog.clear()
    second = make_trigger(handle, double)
    event = await first_event(second, double)
    assert event.payload["status"] == "success"
    assert [x for x in logged_lines(caplog) if len(x) == 1] == ["c"]


@pytest.fixture
def supervisor(monkeypatch):
    """The metadata database as on_kill reads it: the task instance was marked failed."""
    return install_supervisor(monkeypatch, "failed")


for_task_instance = run_for_task_instance


async def start_watching(trigger: SlurmJobTrigger, double: LocalClusterDouble) -> asyncio.Task:
    """Run `trigger` until the poller has written its claim; return the running task."""
    get_poller("slurm_test", lambda _: double)
    task = asyncio.ensure_future(anext(trigger.run()))
    for _ in range(500):
        if trigger._registration is not None and trigger._registration.claimed:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the trigger never claimed its job")


async def kill_while_watching(trigger: SlurmJobTrigger, double: LocalClusterDouble) -> None:
    """What the trigger runner does to a watching trigger on a user's action: cancel its task, then on_kill."""
    task = await start_watching(trigger, double)
    task.cancel()
    await trigger.on_kill()


@pytest.mark.parametrize("ti_state", ["failed", "success", None, "up_for_retry", "scheduled"])
async def test_on_kill_cancels_when_the_task_is_no_longer_deferred(tmp_path, double, supervisor, ti_state):
    supervisor.state = ti_state
    double.states["42"] = JobState.RUNNING
    trigger = for_task_instance(make_trigger(handle_for(tmp_path), double))
    await kill_while_watching(trigger, double)
    assert double.states["42"] is JobState.CANCELED


async def test_a_dag_run_marked_failed_cancels_all_its_jobs_in_one_batch_of_each_kind(tmp_path, double, supervisor):
    """The triggerer runs every waiting task's on_kill at once: one task-state request for the mapped task,
    one claims read, one state query and one scancel batch for all the jobs, each job still decided alone."""
    supervisor.state, supervisor.map_indexes = "failed", [0, 1, 2]
    triggers = []
    for i, job_id in enumerate(["41", "42", "43"]):
        double.states[job_id] = JobState.PENDING
        handle = handle_for(tmp_path, job_id, job_name=f"npa-dag-task-abc123456{i}-t1")
        trigger = run_for_task_instance(make_trigger(handle, double), map_index=i)
        triggers.append((trigger, await start_watching(trigger, double)))
    poller = get_poller("slurm_test", lambda _: double)
    for _, task in triggers:
        task.cancel()
    await asyncio.gather(*(trigger.on_kill() for trigger, _ in triggers))
    assert all(double.states[j] is JobState.CANCELED for j in ("41", "42", "43"))
    assert sorted(double.cancel_batches[0]) == ["41", "42", "43"] and len(double.cancel_batches) == 1
    assert poller.channel.kills.claims.calls == 1 and poller.channel.kills.states.calls == 1
    asked = [m for m in supervisor.asked if type(m).__name__ == "GetTaskStates"]
    assert len(asked) == 1 and asked[0].map_index is None
    assert not [m for m in supervisor.asked if type(m).__name__ == "GetXCom"], "a failed task decides alone"


async def test_jobs_the_listener_already_cancelled_have_their_sidecars_shredded_in_one_command(
    tmp_path, double, supervisor
):
    """The API server's listener cancelled the run's jobs first: each on_kill finds its job ended and removes
    its secrets sidecar; the removals of the triggers that meet share one command."""
    supervisor.state, supervisor.map_indexes = "failed", [0, 1, 2]
    triggers, sidecars = [], []
    for i, job_id in enumerate(["41", "42", "43"]):
        double.states[job_id] = JobState.RUNNING
        sidecar = tmp_path / f"job-{job_id}.env"
        sidecar.write_text("export HF_TOKEN=x\n")
        sidecars.append(str(sidecar))
        handle = handle_for(tmp_path, job_id, job_name=f"npa-dag-task-abc123456{i}-t1", env_file=str(sidecar))
        trigger = run_for_task_instance(make_trigger(handle, double), map_index=i)
        triggers.append((trigger, await start_watching(trigger, double)))
    for _, task in triggers:
        task.cancel()
    for job_id in ("41", "42", "43"):
        double.states[job_id] = JobState.CANCELED  # the listener's batch
    await asyncio.gather(*(trigger.on_kill() for trigger, _ in triggers))
    assert double.cancel_batches == [], "nothing left to cancel"
    assert len(double.shred_calls) == 1 and sorted(double.shred_calls[0]) == sorted(sidecars)
    assert not any(Path(p).exists() for p in sidecars)


@pytest.mark.parametrize("waiting_try", [None, 1], ids=["no-handle", "the-handle-names-its-own-try"])
async def test_on_kill_leaves_a_still_deferred_task_alone(
    tmp_path, double, supervisor, monkeypatch, caplog, waiting_try
):
    """Still deferred, by this very try (a trigger that moved): nothing to cancel."""
    from npa_airflow.common import ownership

    monkeypatch.setattr(ownership, "DECIDE_SECONDS", 0.3)
    monkeypatch.setattr(ownership, "DECIDE_PAUSE", 0.1)
    supervisor.state = "deferred"
    if waiting_try is not None:
        supervisor.xcoms["slurm_job"] = {**dict(handle_for(tmp_path)), "waiting_try": waiting_try}
    double.states["42"] = JobState.RUNNING
    trigger = for_task_instance(make_trigger(handle_for(tmp_path), double))
    await trigger.on_kill()
    assert double.states["42"] is JobState.RUNNING
    assert len(supervisor.asked) >= 2, "a deferred read is re-checked before giving up"
    assert any("undecided" in r.getMessage() for r in caplog.records)


async def test_the_first_trigger_of_a_process_reads_the_task_state_once_in_the_background(
    tmp_path, double, monkeypatch
):
    """Airflow 3.3.2 builds the triggerer's execution API on its first request (seconds): the first trigger pays
    that with one background read, so on_kill's reads later are quick; later triggers make none."""
    supervisor = install_supervisor(monkeypatch, "deferred", warmed=False)
    double.states["42"] = JobState.RUNNING
    first = for_task_instance(make_trigger(handle_for(tmp_path), double))
    first_task = await start_watching(first, double)
    for _ in range(500):
        if supervisor.asked:
            break
        await asyncio.sleep(0.01)
    second = for_task_instance(make_trigger(handle_for(tmp_path, job_id="43"), double))
    double.states["43"] = JobState.RUNNING
    second_task = await start_watching(second, double)
    await asyncio.sleep(0.2)
    assert [type(m).__name__ for m in supervisor.asked] == ["GetTaskStates"]
    first_task.cancel()
    second_task.cancel()


async def test_a_moved_trigger_stands_down_and_never_cancels(tmp_path, double, supervisor, caplog):
    """The holder stalls, another triggerer starts the same trigger (same try): the first one writes nothing
    more, fires nothing and its on_kill cancels nothing, even once the task has ended."""
    out = tmp_path / "slurm-42.out"
    out.write_bytes(b"one\n")
    double.states["42"] = JobState.RUNNING
    first = for_task_instance(make_trigger(handle_for(tmp_path), double))
    first_task = await start_watching(first, double)
    second = for_task_instance(make_trigger(handle_for(tmp_path), double))
    second_task = await start_watching(second, double)
    for _ in range(500):
        if first._registration.superseded:
            break
        await asyncio.sleep(0.01)
    assert first._registration.superseded_by == second._claim
    out.write_bytes(b"one\ntwo\n")
    supervisor.state = "failed"
    await first.on_kill()
    assert double.states["42"] is JobState.RUNNING
    assert supervisor.asked == [], "a superseded trigger needs no database read to know it moved"
    double.states["42"] = JobState.COMPLETE
    event = await asyncio.wait_for(second_task, 10)
    assert event.payload["status"] == "success"
    assert not first_task.done(), "the moved trigger must never fire"
    first_task.cancel()


async def test_on_kill_reads_a_newer_claim_of_the_same_try_as_a_move(tmp_path, double, supervisor):
    """Before its poller has noticed: on_kill reads the claim itself."""
    double.states["42"] = JobState.RUNNING
    first = for_task_instance(make_trigger(handle_for(tmp_path), double))
    task = await start_watching(first, double)
    task.cancel()
    Path(first._claim_file).write_text(f"1 {'b' * 16}\n")
    await first.on_kill()
    assert double.states["42"] is JobState.RUNNING


async def test_a_later_try_holding_the_job_means_cleared_and_cancels(tmp_path, double, supervisor):
    supervisor.state = "deferred"  # the new try is already waiting on the same (reattached) job
    double.states["42"] = JobState.RUNNING
    first = for_task_instance(make_trigger(handle_for(tmp_path), double))
    task = await start_watching(first, double)
    task.cancel()
    Path(first._claim_file).write_text(f"2 {'c' * 16}\n")
    await first.on_kill()
    assert double.states["42"] is JobState.CANCELED


async def test_on_kill_skips_finished_jobs_fired_triggers_and_opt_out(tmp_path, double, supervisor):
    cancels = []

    async def acancel(job_id, *, shred=()):
        cancels.append(job_id)

    double.acancel = acancel
    get_poller("slurm_test", lambda _: double)
    double.states["42"] = JobState.COMPLETE
    await for_task_instance(make_trigger(handle_for(tmp_path), double)).on_kill()
    double.states["42"] = JobState.RUNNING
    fired = for_task_instance(make_trigger(handle_for(tmp_path), double))
    fired._fired = True
    await fired.on_kill()
    await for_task_instance(make_trigger(handle_for(tmp_path), double, cancel_on_kill=False)).on_kill()
    assert cancels == []


async def test_on_kill_logs_instead_of_raising(tmp_path, double, supervisor, caplog):
    double.states["42"] = JobState.RUNNING

    async def acancel(job_id, *, shred=()):
        raise ConnectionError("login host down")

    double.acancel = acancel
    get_poller("slurm_test", lambda _: double)
    await for_task_instance(make_trigger(handle_for(tmp_path), double)).on_kill()
    assert any("Could not cancel Slurm job 42" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "published",
    [
        pytest.param({"slurm_job": {"waiting_try": 2}}, id="the-handle-names-try-2"),
        pytest.param({"slurm_job": {}, "slurm_try": 2}, id="published-before-waiting-try"),
    ],
)
async def test_a_cleared_try_cancels_even_when_the_next_try_is_already_deferred(
    tmp_path, double, supervisor, published
):
    """A clear, and the next try reattached and deferred before on_kill ran (its handle's XCom names try 2; a
    handle an earlier version published names it in its own XCom)."""
    supervisor.state = "deferred"
    handle = dict(handle_for(tmp_path))
    supervisor.xcoms.update(
        {key: {**handle, **value} if key == "slurm_job" else value for key, value in published.items()}
    )
    double.states["42"] = JobState.RUNNING
    trigger = for_task_instance(make_trigger(handle_for(tmp_path), double))
    await kill_while_watching(trigger, double)
    assert double.states["42"] is JobState.CANCELED


async def test_on_kill_finishes_its_decision_when_airflow_cancels_it_again(tmp_path, double, supervisor):
    """The trigger runner cancels the trigger's task again at its next loop while on_kill is still deciding."""
    supervisor.state = "deferred"
    double.states["42"] = JobState.RUNNING
    trigger = for_task_instance(make_trigger(handle_for(tmp_path), double))
    task = await start_watching(trigger, double)
    task.cancel()
    kill = asyncio.ensure_future(trigger.on_kill())
    await asyncio.sleep(0.2)
    kill.cancel()  # the runner's next loop
    supervisor.state = "failed"  # the database now shows the user's mark
    for _ in range(50):
        if double.states["42"] is JobState.CANCELED:
            break
        await asyncio.sleep(0.1)
    assert double.states["42"] is JobState.CANCELED


async def test_pending_lines_carry_the_reason_and_repeat_when_it_changes(tmp_path, double, caplog):
    caplog.set_level(logging.INFO)
    double.states["42"] = JobState.PENDING
    double.reasons["42"] = "Priority"
    trigger = make_trigger(handle_for(tmp_path), double)
    get_poller("slurm_test", lambda _: double)
    gen = trigger.run()
    task = asyncio.ensure_future(anext(gen))

    async def until_logged(text: str) -> None:
        for _ in range(300):
            if any(text in line for line in logged_lines(caplog)):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{text!r} never logged: {logged_lines(caplog)}")

    await until_logged("is PENDING (PENDING, reason Priority)")
    double.reasons["42"] = "Resources"
    await until_logged("is PENDING (PENDING, reason Resources)")
    double.states["42"] = JobState.COMPLETE
    event = await asyncio.wait_for(task, 10)
    await gen.aclose()
    assert event.payload["status"] == "success"
    state_lines = [line for line in logged_lines(caplog) if line.startswith("Slurm job 42 is")]
    assert state_lines == [
        "Slurm job 42 is PENDING (PENDING, reason Priority)",
        "Slurm job 42 is PENDING (PENDING, reason Resources)",
        "Slurm job 42 is COMPLETED (COMPLETE)",
    ]


@pytest.mark.parametrize("reason", ["BadConstraints", "PartitionConfig", "PartitionNodeLimit"])
async def test_a_never_clearing_reason_cancels_and_fires_unsatisfiable(tmp_path, double, reason):
    double.states["42"] = JobState.PENDING
    double.reasons["42"] = reason
    event = await first_event(make_trigger(handle_for(tmp_path), double), double)
    assert event.payload["status"] == "unsatisfiable"
    assert event.payload["reason"] == reason
    assert f"Reason={reason}" in event.payload["message"]
    assert double.states["42"] is JobState.CANCELED
    validate_event(event.payload)


async def test_a_clearing_reason_keeps_waiting(tmp_path, double):
    double.states["42"] = JobState.PENDING
    double.reasons["42"] = "ReqNodeNotAvail, UnavailableNodes:c1"
    trigger = make_trigger(handle_for(tmp_path), double, deadline=time.time() + 0.5)
    event = await first_event(trigger, double)
    assert event.payload["status"] == "deadline"


async def test_a_job_sacct_and_squeue_keep_not_knowing_ends_the_wait_as_vanished(tmp_path, double):
    double.absent.add("42")
    trigger = make_trigger(handle_for(tmp_path), double, vanished_after=0.05)
    payload = (await first_event(trigger, double)).payload
    assert payload["status"] == "vanished"
    assert "neither sacct nor squeue" in payload["message"] and "never seen by this wait" in payload["message"]
    assert validate_event(payload) is payload


async def test_a_job_merely_missing_while_accounting_is_down_is_never_vanished(tmp_path, double):
    """Without an answer from both tools the job is only unknown: the wait goes on to its deadline."""
    trigger = make_trigger(handle_for(tmp_path), double, vanished_after=0.0, deadline=time.time() + 0.5)
    payload = (await first_event(trigger, double)).payload
    assert payload["status"] == "deadline"


async def test_the_trigger_records_airflows_cancel_and_retries_an_unanswered_one(tmp_path, double, monkeypatch):
    from npa_airflow.exceptions import NpaRemoteError
    from npa_airflow.slurm.watch import trigger_cancel

    monkeypatch.setattr(trigger_cancel, "CANCEL_BACKOFF", trigger_cancel.Backoff(base=0.0, cap=0.0, jitter=0.0))
    markers, answers = [], [NpaRemoteError("Unable to contact slurm controller"), "cancelled"]

    async def acancel(job_id, *, marker=None, shred=()):
        markers.append(marker)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    double.acancel = acancel
    get_poller("slurm_test", lambda _: double)
    trigger = make_trigger(handle_for(tmp_path, script_path="/r/sbatch/npa-dag-task-abc1234567-t1.sbatch"), double)
    assert await trigger._cancel("its deadline passed") == "cancelled"
    assert markers == ["/r/sbatch/npa-dag-task-abc1234567-t1.sbatch.npa-cancelled"] * 2


@pytest.mark.parametrize(
    ("state", "with_file", "status"),
    [
        (JobState.ERROR, True, "continue"),
        (JobState.COMPLETE, True, "continue"),
        (JobState.COMPLETE, False, "success"),
        (JobState.ERROR, False, "failed"),
        (JobState.CANCELED, True, "canceled"),  # a cancel ends the run, whatever the command wrote
    ],
)
async def test_a_segment_that_left_its_continue_file_asks_for_the_next(tmp_path, double, state, with_file, status):
    handle = handle_for(tmp_path)
    continue_file = Path(handle["results_dir"]) / "npa-continue"
    if with_file:
        continue_file.parent.mkdir(parents=True)
        continue_file.write_text("step 41000\n")
    double.states["42"] = state
    event = await first_event(make_trigger(handle, double, continue_file=str(continue_file)), double)
    assert event.payload["status"] == status
    validate_event(event.payload)


def test_a_requeue_is_logged_on_slurmctld_s_word_not_on_lagging_accounting(tmp_path, caplog):
    """A job that just started can read PENDING in sacct for a cycle (accounting lags); a requeue is PENDING in
    squeue after the job ran, or in sacct after sacct said RUNNING (recorded on 22.05 and 24.11:
    samples/*/preempted_requeue_*)."""
    from npa_airflow.slurm.commands import SlurmJobInfo
    from npa_airflow.slurm.watch.poll_records import PollUpdate

    trigger = make_trigger(handle_for(tmp_path), LocalClusterDouble())
    caplog.set_level(logging.INFO, logger=LOGGER)

    def seen(state: JobState, source: str, reason: str | None = None) -> None:
        info = SlurmJobInfo("42", state.name, state, None, None, "n", "c1", reason, source)
        trigger._state_log.note(PollUpdate(cycle=1, state=state, info=info))

    seen(JobState.PENDING, "squeue", "Resources")
    seen(JobState.RUNNING, "squeue")
    seen(JobState.PENDING, "sacct")  # accounting's lag
    seen(JobState.RUNNING, "squeue")

    def requeues() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == LOGGER and "was requeued" in r.getMessage()]

    assert not requeues()
    seen(JobState.PENDING, "sacct")  # 24.11's record of the requeued job
    seen(JobState.PENDING, "squeue", "BeginTime")
    seen(JobState.PENDING, "squeue", "Resources")  # still the same requeue
    seen(JobState.RUNNING, "squeue")
    seen(JobState.PENDING, "squeue", "BeginTime")
    assert len(requeues()) == 2 and "Slurm's reason: BeginTime" in requeues()[0]
    # Accounting that said RUNNING itself does not lag: its PENDING is the requeued job's record (22.05 gives the
    # reason there too), said once, whatever squeue says next.
    seen(JobState.RUNNING, "sacct")
    seen(JobState.PENDING, "sacct", "BeginTime")
    seen(JobState.PENDING, "squeue", "Resources")
    seen(JobState.RUNNING, "sacct")
    assert len(requeues()) == 3 and "Slurm's reason: BeginTime" in requeues()[2]
    # After squeue's RUNNING, sacct's PENDING may be its lag: the requeue is said when squeue, asked next cycle for
    # a job last seen pending, says PENDING too (the same state and reason: no second state line).
    seen(JobState.PENDING, "squeue", "BeginTime")  # requeued again; the next run is one sacct has not seen
    seen(JobState.RUNNING, "squeue")
    seen(JobState.PENDING, "sacct", "BeginTime")
    assert len(requeues()) == 4
    seen(JobState.PENDING, "squeue", "BeginTime")
    assert len(requeues()) == 5
    states = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.getMessage().startswith("Slurm job 42 is")
    ]
    assert states[-2:] == ["Slurm job 42 is RUNNING (RUNNING)", "Slurm job 42 is PENDING (PENDING, reason BeginTime)"]
