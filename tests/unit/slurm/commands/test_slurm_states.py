"""The seed's native state table, including the annotated and truncated forms sacct prints."""

from __future__ import annotations

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands.states import NATIVE_STATE_TABLE, interpret_native_state, normalize_native_state


@pytest.mark.parametrize(
    ("native", "expected"),
    [
        ("PENDING", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("COMPLETING", JobState.RUNNING),
        ("SUSPENDED", JobState.RUNNING),
        ("STOPPED", JobState.RUNNING),
        ("CONFIGURING", JobState.RUNNING),
        ("RESIZING", JobState.RUNNING),
        ("REQUEUED", JobState.PENDING),
        ("REQUEUE_FED", JobState.PENDING),
        ("REQUEUE_HOLD", JobState.PENDING),
        ("PREEMPTED", JobState.ERROR),  # unless squeue shows it requeued (REQUEUE_CANDIDATE_STATES)
        ("COMPLETED", JobState.COMPLETE),
        ("FAILED", JobState.ERROR),
        ("TIMEOUT", JobState.ERROR),
        ("OUT_OF_MEMORY", JobState.ERROR),
        ("NODE_FAIL", JobState.ERROR),
        ("BOOT_FAIL", JobState.ERROR),
        ("DEADLINE", JobState.ERROR),
        ("CANCELLED", JobState.CANCELED),
        ("REVOKED", JobState.CANCELED),
        # sacct annotations and truncation
        ("CANCELLED by 0", JobState.CANCELED),
        ("CANCELLED by 1001", JobState.CANCELED),
        ("CANCELLED+", JobState.CANCELED),
        ("  completed  ", JobState.COMPLETE),
        # never a crash
        ("", JobState.UNKNOWN),
        (None, JobState.UNKNOWN),
        ("WIBBLE", JobState.UNKNOWN),
        ("   ", JobState.UNKNOWN),
    ],
)
def test_interpret_native_state(native, expected):
    assert interpret_native_state(native) is expected


def test_requeue_states_are_not_terminal():
    for native in ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        assert not interpret_native_state(native).is_terminal


def test_a_preemption_is_an_end_only_squeue_can_confirm():
    """A requeued job's accounting says PREEMPTED while it is requeued: the end is checked against squeue, and it
    is an infrastructure end that blames no node."""
    from npa_airflow.slurm.commands.states import BLAMELESS_NATIVE_STATES, INFRA_NATIVE_STATES, REQUEUE_CANDIDATE_STATES

    assert interpret_native_state("PREEMPTED").is_terminal
    assert "PREEMPTED" in REQUEUE_CANDIDATE_STATES & INFRA_NATIVE_STATES & BLAMELESS_NATIVE_STATES


def test_only_completed_is_success():
    assert [n for n, s in NATIVE_STATE_TABLE.items() if s.is_success] == ["COMPLETED"]


def test_normalize_native_state():
    assert normalize_native_state("CANCELLED by 0") == "CANCELLED"
    assert normalize_native_state("CANCELLED+") == "CANCELLED"
    assert normalize_native_state("node_fail") == "NODE_FAIL"
    assert normalize_native_state("") == ""
