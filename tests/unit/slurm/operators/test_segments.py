"""A long run in segments (operators/segments.py): the names, the state that travels between segments, the run's
usage, and what the operator does with a segment that asks to be continued or a job preempted without requeue
(driven through SlurmSubmitOperator and a hook double; the real cluster: tests/integration/test_slurm_segments.py)."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from npa_airflow.common.naming import first_segment_name, segment_job_name, segment_of
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands import LogChunk, SubmitResult
from npa_airflow.slurm.operators.segments import RunState, checkpoint_note, run_usage, segment_usage_entry
from npa_airflow.slurm.triggers import make_event_payload
from npa_airflow.trusted_jobs import _STEP_SUFFIX
from tests.harness.slurm_operator_doubles import HookDouble, context, handle_dict, install_unit_connection, make_op
from tests.harness.slurm_operator_doubles import name as try_name

USAGE = {"gpus": 8, "nodes": 1, "elapsed_seconds": 3600, "gpu_hours": 8.0}
ENDED = dict(signal=None, node_list="c1", reason=None, log_tail="")


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    install_unit_connection(monkeypatch)


class CheckpointingHook(HookDouble):
    """The cluster holds the segment's continue file, written by a command that checkpointed."""

    def tail_logs(self, requests, max_bytes=1 << 20):
        self.calls.append(("read", tuple(p for p, _ in requests)))
        return [LogChunk(path=p, data=b"step 41000\nmore\n", offset=o, size=16) for p, o in requests]


def segment_handle(segment: int, job_id: str = "101") -> dict:
    handle = handle_dict(job_id)
    handle["job_name"] = segment_job_name(try_name(1), segment)
    return handle


def continue_event(segment: int, native: str = "TIMEOUT", exit_code: int = 0, **extra) -> dict:
    state = "COMPLETE" if native == "COMPLETED" else "ERROR"
    return make_event_payload(
        "continue",
        segment_handle(segment),
        "asked to be continued",
        state=state,
        native_state=native,
        exit_code=exit_code,
        usage=USAGE,
        **ENDED,
        **extra,
    )


# -- names --------------------------------------------------------------------------------------------------


def test_a_segment_s_name_keeps_the_try_suffix_last_and_leads_back_to_its_run():
    first = "npa-dag-train-0123456789-t2"
    third = segment_job_name(first, 3)
    assert third == "npa-dag-train-0123456789-s3-t2"
    assert (segment_of(first), segment_of(third)) == (1, 3)
    assert first_segment_name(third) == first and segment_job_name(third, 1) == first
    assert segment_job_name(third, 4) == "npa-dag-train-0123456789-s4-t2"
    assert _STEP_SUFFIX.sub("", third) == first  # the API server takes it for one of the task's tries
    with pytest.raises(NpaValidationError, match="no try suffix"):
        segment_job_name("hand-made", 2)


# -- what travels between segments ---------------------------------------------------------------------------


def test_the_run_state_round_trips_and_anything_malformed_reads_as_none():
    run = RunState(({"segment": 1, "job_id": "7", **USAGE},), 2, 1000.0)
    assert RunState.from_kwargs(run.to_kwargs()["run"]) == run
    for bad in (None, "x", {"usage": "x", "preemptions": -1, "first_submitted_at": True}):
        assert RunState.from_kwargs(bad) == RunState()


def test_the_run_s_usage_is_the_single_segment_s_or_the_sum_with_each_segment():
    one = segment_usage_entry(1, "7", USAGE, "")
    assert run_usage((one,)) == USAGE  # the shape of a job that is not continued
    unknown = segment_usage_entry(2, "8", None, "the cluster keeps no accounting")
    two = segment_usage_entry(3, "9", {**USAGE, "gpus": 16, "nodes": 2, "gpu_hours": 16.0}, "")
    total = run_usage((one, unknown, two))
    assert total["gpu_hours"] == 24.0 and total["elapsed_seconds"] == 7200
    assert (total["gpus"], total["nodes"]) == (16, 2)
    assert [s["segment"] for s in total["segments"]] == [1, 2, 3] and "unknown" in total["segments"][1]
    assert run_usage((unknown,)) is None


def test_the_checkpoint_note_is_the_first_printable_line():
    assert checkpoint_note(b"step 41000\nloss 0.3\n") == "step 41000"
    assert checkpoint_note(b"\x1b[31mstep 9\x07") == "?[31mstep 9?"
    assert len(checkpoint_note(b"x" * 5000)) == 200


# -- the operator ------------------------------------------------------------------------------------------


def test_a_segment_that_asks_to_be_continued_submits_the_next_one_and_defers_again(capfd):
    hook = CheckpointingHook(submit_outcomes=[SubmitResult(job_id="102", cluster=None)])
    op = make_op(hook, max_segments=12)
    ctx = context()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(ctx, continue_event(2, exit_code=None))
    trigger = deferred.value.trigger
    assert trigger.handle.job_name == segment_job_name(try_name(1), 3)
    assert trigger.handle.results_dir == f"/shared/results/{try_name(1)}"  # the run's results dir
    assert trigger.continue_file == f"/shared/results/{try_name(1)}/npa-continue"
    run = RunState.from_kwargs(deferred.value.kwargs["run"])
    assert [e["segment"] for e in run.usage] == [2] and run.first_submitted_at == 1.0
    assert ("read", (f"/shared/results/{try_name(1)}/npa-continue",)) in hook.calls
    (submitted,) = [c for c in hook.calls if c[0] == "submit"]
    assert submitted[1].endswith(f"/{segment_job_name(try_name(1), 3)}.sbatch")
    logged = capfd.readouterr().out
    assert "Segment 2 of at most 12 ended to be continued (TIMEOUT (time limit) after 1 h 0 min 0 s, " in logged
    assert "checkpoint: step 41000)" in logged
    assert ctx["ti"].pushed["npa_usage"] == USAGE


def test_the_run_s_total_usage_is_pushed_at_each_segment_s_end():
    hook = CheckpointingHook(submit_outcomes=[SubmitResult(job_id="102", cluster=None)])
    ctx = context()
    earlier = RunState((segment_usage_entry(1, "100", USAGE, ""),), 0, 1.0).to_kwargs()["run"]
    with pytest.raises(TaskDeferred):
        make_op(hook, max_segments=3).execute_complete(ctx, continue_event(2), run=earlier)
    assert ctx["ti"].pushed["npa_usage"]["gpu_hours"] == 16.0
    assert [s["job_id"] for s in ctx["ti"].pushed["npa_usage"]["segments"]] == ["100", "101"]


def test_max_wait_counts_from_the_run_s_first_submission():
    hook = CheckpointingHook(submit_outcomes=[SubmitResult(job_id="102", cluster=None)])
    earlier = RunState((), 0, 500.0).to_kwargs()["run"]
    with pytest.raises(TaskDeferred) as deferred:
        make_op(hook, max_segments=3, max_wait=7200).execute_complete(context(), continue_event(2), run=earlier)
    assert deferred.value.trigger.deadline == 500.0 + 7200


def test_the_last_allowed_segment_asking_to_continue_fails_with_advice_and_no_submission():
    hook = CheckpointingHook()
    with pytest.raises(AirflowFailException, match=r"max_segments=3\. Raise max_segments") as failed:
        make_op(hook, max_segments=3).execute_complete(context(), continue_event(3, "FAILED", 124))
    assert "(FAILED (the child timeout) after 1 h 0 min 0 s, checkpoint: step 41000)" in str(failed.value)
    assert not [c for c in hook.calls if c[0] == "submit"]


def test_a_job_preempted_without_requeue_is_resubmitted_on_its_own_budget_then_retried():
    preempted = dict(state="ERROR", native_state="PREEMPTED", exit_code=0, usage=USAGE, **ENDED)
    event = make_event_payload("failed", handle_dict(), "Slurm job 101 ended PREEMPTED", **preempted)
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="102", cluster=None)])
    with pytest.raises(TaskDeferred) as deferred:
        make_op(hook, max_preemptions=1).execute_complete(context(), event)
    assert deferred.value.trigger.handle.job_name == segment_job_name(try_name(1), 2)
    assert RunState.from_kwargs(deferred.value.kwargs["run"]).preemptions == 1

    used = RunState((), 1, 1.0).to_kwargs()["run"]
    ctx = context()
    with pytest.raises(AirflowException, match=r"infrastructure reason .*job state PREEMPTED") as failed:
        make_op(HookDouble(), max_preemptions=1).execute_complete(ctx, event, run=used)
    assert not isinstance(failed.value, AirflowFailException)  # a retry: the budget of this try is spent
    assert "excludes" not in str(failed.value)  # a preemption is not the nodes' fault


def test_a_time_limit_without_the_contract_names_the_options():
    timeout = dict(state="ERROR", native_state="TIMEOUT", exit_code=0, usage=USAGE, **ENDED)
    event = make_event_payload("failed", handle_dict(), "Slurm job 101 ended TIMEOUT", **timeout)
    with pytest.raises(AirflowFailException, match=r"checkpoint_signal='USR1@900'.*max_segments=N"):
        make_op(HookDouble()).execute_complete(context(), event)


@pytest.mark.parametrize("bad", [0, 1001, 2.0, True])
def test_max_segments_outside_its_range_is_refused_at_parse_time(bad):
    with pytest.raises(NpaValidationError, match="max_segments"):
        make_op(HookDouble(), max_segments=bad)


def test_a_retry_looks_for_every_segment_an_earlier_try_may_have_submitted():
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="200", cluster=None)])
    op = make_op(hook, max_segments=2, max_preemptions=1)
    ctx = context(try_number=2)
    op.render_template_fields(ctx)
    with pytest.raises(TaskDeferred):
        op.execute(ctx)
    (find,) = [c for c in hook.calls if c[0] == "find"]
    assert set(find[1]) >= {try_name(1), segment_job_name(try_name(1), 2), segment_job_name(try_name(1), 3)}


def test_a_secret_the_command_wrote_into_its_continue_file_is_masked_in_the_log(monkeypatch, capfd):
    """A new worker process resumes the task: the job's secrets are registered with its masker before the file
    is read into the log."""
    monkeypatch.setenv("AIRFLOW_VAR_HF_TOKEN", "step 41000")
    hook = CheckpointingHook(submit_outcomes=[SubmitResult(job_id="102", cluster=None)])
    op = make_op(hook, max_segments=3, secret_env={"HF_TOKEN": "var:hf_token"})
    with pytest.raises(TaskDeferred):
        op.execute_complete(context(), continue_event(1))
    logged = capfd.readouterr().out
    assert "checkpoint: ***)" in logged and "step 41000" not in logged
