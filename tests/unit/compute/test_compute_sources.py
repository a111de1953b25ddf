"""The Compute page's sources: one state query per cluster (pending reasons included), and handles checked."""

from __future__ import annotations

import types

from npa_airflow.common.states import JobState
from npa_airflow.compute import sources
from npa_airflow.slurm.commands import SlurmJobInfo


def info(job_id: str, state: JobState, source: str, reason: str | None = None) -> SlurmJobInfo:
    return SlurmJobInfo(job_id, state.value, state, None, None, "n", None, reason, source)


def test_one_query_reads_every_shown_job_with_slurmctld_s_pending_reason(monkeypatch):
    """One round trip: sacct for the states, and one squeue for every shown job in the same command, because only
    slurmctld has a pending job's reason (24.11's sacct prints None)."""
    from npa_airflow.slurm.commands import JobQuery
    from npa_airflow.slurm.hook import SlurmHook

    asked = []

    def query_jobs(self, job_ids, *, pending=()):
        asked.append((self.cluster, list(job_ids), list(pending)))
        return JobQuery(
            {"7": info("7", JobState.PENDING, "squeue", "Resources"), "9": info("9", JobState.RUNNING, "sacct")}
        )

    monkeypatch.setattr(SlurmHook, "query_jobs", query_jobs)
    monkeypatch.setattr(SlurmHook, "config", types.SimpleNamespace(cluster_name="main"), raising=False)
    answer = sources._slurm_fetch("slurm_default", "b")(["7", "9"])
    assert asked == [("b", ["7", "9"], ["7", "9"])]
    assert answer["7"]["reason"] == "Resources" and answer["9"]["state"] == "RUNNING"


def test_a_handle_that_is_not_its_task_s_own_gets_a_row_saying_so_and_reaches_no_cluster(monkeypatch):
    """One task's malformed or foreign handle: its row says why, every other row is right, and the cluster's one
    state query is asked about the other jobs only."""
    from npa_airflow import trusted_jobs
    from npa_airflow.common.deployment import current_deployment
    from npa_airflow.common.naming import job_name_for
    from npa_airflow.compute import rows as r
    from npa_airflow.compute.cache import CachedAnswer
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

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
    monkeypatch.setattr(sources, "task_settings", lambda version, task, attr: trusted_jobs.TaskSettings("slurm"))
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
