"""A Slurm job that prints its secrets, in a real Airflow: the task log shows masks only.

The job's output reaches the task log from the triggerer (streamed while DEFERRED) and from the worker that
completes the task (the failure message with the end of the output); both must mask every `secret_env` value,
including each line of a multi-line value and a value full of regex metacharacters. The Variables' names are
not sensitive to Airflow, so nothing but the provider's own registration masks them. The same guarantees are
proved in-process against the real cluster by tests/integration/test_slurm_secrets.py.
"""

from __future__ import annotations

import uuid

import pytest

DAG_ID = "npa_e2e_slurm_secrets"
TASK_ID = "printer"


@pytest.fixture
def secrets(api) -> list[str]:
    """Fresh values for the DAG's three Variables; returns every fragment that must never be shown."""
    tag = uuid.uuid4().hex[:10]
    values = {
        "npa_e2e_plain_value": f"plain-{tag}",
        "npa_e2e_multi_value": f"first-line-{tag}\nsecond-line-{tag}\n",
        "npa_e2e_regex_value": f"a.b*c(d)+[e]?$f^g|h\\i{{2}}-{tag}",
    }
    for key, value in values.items():
        api.set_variable(key, value)
    return [line for value in values.values() for line in value.splitlines()]


def run_to_end(api, exit_code: int, state: str) -> tuple[str, list[str]]:
    api.wait_for_dag(DAG_ID)
    run_id = api.trigger(DAG_ID, conf={"exit_code": exit_code})
    ti = api.wait_for_state(DAG_ID, run_id, TASK_ID, {state}, timeout=240)
    return run_id, api.log_lines(DAG_ID, run_id, TASK_ID, ti["try_number"])


def test_the_streamed_output_shows_masks_for_every_secret(api, secrets):
    run_id, lines = run_to_end(api, 0, "success")
    text = "\n".join(lines)
    assert "printed-all" in text, text  # the job's output did reach the log
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"secrets in the task log: {leaked}\n{text}"
    assert any("key=***!" in line for line in lines) and any("x***y" in line for line in lines), text
    handle = api.xcom(DAG_ID, run_id, TASK_ID, "slurm_job")
    rendered = api.task_instance(DAG_ID, run_id, TASK_ID)["rendered_fields"]
    assert not [s for s in secrets if s in str(handle) + str(rendered)]


def test_the_failure_message_written_after_the_deferral_is_masked(api, secrets):
    _, lines = run_to_end(api, 3, "failed")
    text = "\n".join(lines)
    assert "a program failure" in text and text.count("printed-all") >= 2, text  # streamed, then in the message
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"secrets in the task log: {leaked}\n{text}"
