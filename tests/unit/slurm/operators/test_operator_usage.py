"""The job's GPU-hours at the end of a step: the event's usage to XCom `npa_usage` and one line of the task log,
whatever the outcome (Completion, driven through SlurmSubmitOperator and a hook double)."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.slurm.commands import JobUsage
from npa_airflow.slurm.operators import SlurmSubmitOperator
from npa_airflow.slurm.triggers import make_event_payload
from npa_airflow.slurm.watch.trigger_events import ENDED_FIRST, NO_ACCOUNTING
from tests.harness.airflow_tasks import collecting_logger
from tests.harness.slurm_operator_doubles import HookDouble, context, handle_dict, install_unit_connection, make_op

USAGE = JobUsage(gpus=16, nodes=2, elapsed_seconds=480).to_dict()
LINE = "GPU usage: 2.13 GPU-hours (16 GPUs on 2 nodes x 8 min 0 s)"
FAILED = dict(state="ERROR", native_state="FAILED", exit_code=3, signal=None, node_list="g[1-2]", reason=None)


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    install_unit_connection(monkeypatch)


@pytest.fixture
def logged(monkeypatch):
    """The lines the operator logs (its `log` replaced by a collecting logger)."""
    logger, collected = collecting_logger("usage")
    monkeypatch.setattr(SlurmSubmitOperator, "log", property(lambda self: logger))
    return collected.lines


def test_a_success_pushes_its_usage_and_ends_with_its_line(logged):
    ctx = context()
    event = make_event_payload("success", handle_dict(), "done", usage=USAGE)
    assert make_op(HookDouble()).execute_complete(ctx, event) == handle_dict()
    assert ctx["ti"].pushed["npa_usage"] == USAGE
    assert logged[-1] == LINE


def test_a_failed_job_s_usage_is_pushed_before_the_task_fails(logged):
    ctx = context()
    event = make_event_payload(
        "failed", handle_dict(), "Slurm job 101 ended FAILED", log_tail="", usage=USAGE, **FAILED
    )
    with pytest.raises(AirflowFailException):
        make_op(HookDouble()).execute_complete(ctx, event)
    assert ctx["ti"].pushed["npa_usage"] == USAGE
    assert LINE in logged


def test_without_accounting_the_usage_is_none_and_the_line_says_unknown(logged):
    ctx = context()
    event = make_event_payload("success", handle_dict(), "done", usage=None, usage_unknown=NO_ACCOUNTING)
    make_op(HookDouble()).execute_complete(ctx, event)
    assert "npa_usage" in ctx["ti"].pushed and ctx["ti"].pushed["npa_usage"] is None
    assert logged[-1] == "GPU usage: unknown (the cluster keeps no accounting)"


def test_a_wait_that_ended_first_says_the_usage_is_unknown(logged):
    ctx = context()
    event = make_event_payload("deadline", handle_dict(), "late", usage=None, usage_unknown=ENDED_FIRST)
    with pytest.raises(AirflowException, match="deadline"):
        make_op(HookDouble()).execute_complete(ctx, event)
    assert ctx["ti"].pushed["npa_usage"] is None
    assert f"GPU usage: unknown ({ENDED_FIRST})" in logged


def test_an_event_of_an_earlier_release_has_no_usage_and_still_completes(logged):
    ctx = context()
    assert make_op(HookDouble()).execute_complete(ctx, make_event_payload("success", handle_dict(), "done"))
    assert ctx["ti"].pushed["npa_usage"] is None
    assert logged[-1] == "GPU usage: unknown (the wait reported none)"
