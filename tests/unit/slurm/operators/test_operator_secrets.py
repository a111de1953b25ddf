"""SlurmSubmitOperator's `secret_env` on the worker: references (never values) in the trigger, masks registered
before the job's output is written here, the sidecar named in the handle and shredded with every cancel."""

from __future__ import annotations

import uuid

import pytest
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.common.secret_masking import redact_text
from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import LogChunk, SubmitResult
from npa_airflow.slurm.triggers import make_event_payload
from tests.harness.slurm_operator_doubles import (
    HookDouble,
    context,
    handle_dict,
    install_unit_connection,
    job,
    make_op,
    name,
    run_execute,
)


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    install_unit_connection(monkeypatch)


@pytest.fixture
def secret(monkeypatch) -> tuple[str, str]:
    """A Variable whose name Airflow does not consider sensitive: only an explicit mask hides its value."""
    key = f"npa_op_plain_{uuid.uuid4().hex}"
    value = f"op-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv(f"AIRFLOW_VAR_{key.upper()}", value)
    return f"var:{key}", value


def test_the_trigger_gets_references_and_the_handle_names_the_sidecar(secret):
    ref, value = secret
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="101", cluster=None)])
    ctx = context()
    trigger = run_execute(make_op(hook, secret_env={"NPA_KEY": ref}), ctx)
    kwargs = trigger.serialize()[1]
    assert kwargs["secret_env"] == {"NPA_KEY": ref}
    assert value not in repr(kwargs) and value not in repr(ctx["ti"].pushed)
    assert trigger.handle.env_file == f"/shared/results/sidecars/{name(1)}.env"
    assert redact_text(f"x {value} y") == "x *** y"  # registered before anything of the job is logged here


def test_a_job_without_secrets_keeps_the_handle_shape():
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="101", cluster=None)])
    trigger = run_execute(make_op(hook), context())
    assert trigger.handle.env_file is None and trigger.serialize()[1]["secret_env"] == {}


def test_the_failure_message_masks_what_the_job_printed(secret, monkeypatch):
    """execute_complete runs in a new worker process after the deferral: it registers the values again."""
    ref, value = secret

    class PrintingHook(HookDouble):
        def tail_logs(self, requests, max_bytes=1 << 20):
            data = f"echo $NPA_KEY\n{value}\nTraceback: boom\n".encode()
            return [LogChunk(path=p, data=data[-max_bytes:], offset=o, size=len(data)) for p, o in requests]

    op = make_op(PrintingHook(), secret_env={"NPA_KEY": ref})
    handle = {**handle_dict(), "env_file": f"/shared/results/sidecars/{name(1)}.env"}
    event = make_event_payload(
        "failed", handle, "Slurm job 101 ended FAILED (exit code 3)", native_state="FAILED", state="ERROR",
        exit_code=3, signal=None, node_list="c1", reason=None, log_tail="",
    )  # fmt: skip
    with pytest.raises(AirflowFailException) as failed:
        op.execute_complete(context(), event)
    assert value not in str(failed.value) and "***" in str(failed.value)


def test_every_cancel_shreds_the_sidecar_of_the_cancelled_job(secret):
    ref, _ = secret
    earlier = job("55", name(1), JobState.RUNNING)
    hook = HookDouble(existing=[earlier], submit_outcomes=[SubmitResult(job_id="102", cluster=None)])
    op = make_op(hook, secret_env={"NPA_KEY": ref}, on_previous_try="cancel")
    trigger = run_execute(op, context(try_number=2))
    assert ("cancel", "55") in hook.calls
    assert ("shred", (f"/shared/results/sidecars/{name(1)}.env",)) in hook.calls  # the earlier try's sidecar

    deadline = make_event_payload("deadline", trigger.handle.to_dict(), "deadline passed")
    with pytest.raises(Exception, match="deadline"):
        op.execute_complete(context(try_number=2), deadline)
    assert hook.calls[-1] == ("shred", (trigger.handle.env_file,))
