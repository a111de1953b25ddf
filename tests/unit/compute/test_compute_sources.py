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


def test_a_handle_that_is_not_its_task_s_own_gets_a_row_saying_so_and_reaches_no_cluster(monkeypatch):
    """One task's malformed or foreign handle: its row says why, every other row is right, and the cluster's one
    state query is asked about the other jobs only."""
    from npa_airflow import trusted_jobs
    from npa_airflow.common.deployment import current_deployment
    from npa_airflow.common.naming import job_name_for
    from npa_airflow.compute import rows as r
    from npa_airflow.compute.cache import CachedAnswer
    from npa_airflow.slurm.connection import SlurmConnectionConfig

    def handle(job_id, task="t", **changes):
        name = job_name_for("d", task, "run", -1, 1, deployment=current_deployment())
        return {
            "conn_id": "slurm", "cluster": None, "job_id": job_id, "job_name": name, "login_host": "h:22",
            "results_dir": f"/r/{name}", "stdout_path": "/r/o", "stderr_path": "/r/e", "try_number": 1, **changes,
        }  # fmt: skip

    tasks = [
        r.LiveTask("d", "run", "t", -1, 1, "deferred", {"slurm_job": handle("7")}, {}, "v1"),
        r.LiveTask("d", "run", "u", -1, 1, "deferred", {"slurm_job": {"job_id": "8"}}, {}, "v1"),  # no conn_id
        r.LiveTask("d", "run", "w", -1, 1, "deferred", {"slurm_job": handle("9; rm -rf /", task="w")}, {}, "v1"),
        r.LiveTask("d", "run", "x", -1, 1, "deferred", {"slurm_job": handle("10", task="t")}, {}, "v1"),  # t's name
    ]
    monkeypatch.setattr(sources, "live_tasks", lambda: tasks)
    monkeypatch.setattr(trusted_jobs, "task_settings", lambda version, task, attr: trusted_jobs.TaskSettings("slurm"))
    config = SlurmConnectionConfig(conn_id="slurm", hosts=(("h", 22),), user="npa", results_root="/r")
    monkeypatch.setattr(sources, "_slurm_configs", lambda ids: dict.fromkeys(ids, config))
    asked = []

    class Cache:
        def get(self, key, items, fetch, wait=0.5):
            asked.append((key, list(items)))
            return CachedAnswer(1.0, tuple(items), {"7": {"state": "RUNNING", "native_state": "RUNNING"}})

    snap = sources.snapshot(Cache(), now=2.0)
    assert asked == [("slurm|slurm|", ["7"])]
    by_task = {row.task_id: row for row in snap.rows}
    assert by_task["t"].state == "RUNNING" and by_task["t"].error is None
    assert "malformed Slurm job handle" in by_task["u"].error and by_task["u"].cluster == "-"
    assert "malformed Slurm job handle" in by_task["w"].error
    assert "is not the name of any try of this task instance" in by_task["x"].error
