"""The Compute page's Slurm fetch: one batched state query, then one squeue only for the reasons of pending jobs."""

from __future__ import annotations

import types

from npa_airflow.common.states import JobState
from npa_airflow.compute import sources
from npa_airflow.slurm.commands import SlurmJobInfo


def info(job_id: str, state: JobState, source: str, reason: str | None = None) -> SlurmJobInfo:
    return SlurmJobInfo(job_id, state.value, state, None, None, "n", None, reason, source)


class FakeHook:
    cluster = None
    config = types.SimpleNamespace(cluster_name="main")

    def __init__(self, squeue_out: str = "", rc: int = 0) -> None:
        self.commands: list[list[str]] = []
        self.squeue_out, self.rc = squeue_out, rc

    def run(self, argv, check=True):
        self.commands.append(list(argv))
        return types.SimpleNamespace(returncode=self.rc, text=self.squeue_out)


def test_pending_jobs_from_accounting_get_squeue_s_reason_in_one_command():
    hook = FakeHook("7|7|PENDING|Resources|(null)|n\n8|8|PENDING|Priority|(null)|n\n")
    states = {
        "7": info("7", JobState.PENDING, "sacct"),
        "8": info("8", JobState.PENDING, "sacct"),
        "9": info("9", JobState.RUNNING, "sacct"),
        "10": info("10", JobState.PENDING, "squeue", "BeginTime"),  # squeue answered already
    }
    reasons = sources._pending_reasons(hook, states)
    assert {k: v.reason for k, v in reasons.items()} == {"7": "Resources", "8": "Priority"}
    (command,) = hook.commands
    assert command[:2] == ["squeue", "-h"] and "--jobs=7,8" in command and ["-M", "main"] == command[4:6]


def test_nothing_pending_costs_no_squeue_and_a_failed_squeue_leaves_the_states():
    hook = FakeHook()
    assert sources._pending_reasons(hook, {"9": info("9", JobState.RUNNING, "sacct")}) == {}
    assert hook.commands == []
    failing = FakeHook(rc=1)
    assert sources._pending_reasons(failing, {"7": info("7", JobState.PENDING, "sacct")}) == {}
