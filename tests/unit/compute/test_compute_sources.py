"""The Compute page's sources: one state query per cluster (pending reasons included), and handles checked."""

from __future__ import annotations

import contextlib
import json
import types
from dataclasses import replace

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


def _own_handle(job_id: str) -> dict:
    from npa_airflow.common.deployment import current_deployment
    from npa_airflow.common.naming import job_name_for

    name = job_name_for("d", "t", "run", -1, 1, deployment=current_deployment())
    return {
        "conn_id": "slurm", "cluster": None, "job_id": job_id, "job_name": name, "login_host": "h:22",
        "results_dir": f"/r/{name}", "stdout_path": "/r/o", "stderr_path": "/r/e", "try_number": 1,
    }  # fmt: skip


def test_a_running_jobs_usage_travels_from_the_state_query_through_the_cache_into_its_row(monkeypatch):
    """No extra round trip: the state query's sacct usage is in the cached answer, and the row shows its GPU-hours;
    the same query without usage (squeue only) shows them unknown."""
    from npa_airflow import trusted_jobs
    from npa_airflow.compute import rows as r
    from npa_airflow.compute.cache import CachedAnswer
    from npa_airflow.slurm.commands import JobQuery, JobUsage
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

    used = JobUsage(gpus=8, nodes=1, elapsed_seconds=1800)
    running = replace(info("7", JobState.RUNNING, "squeue"), usage=used)
    monkeypatch.setattr(SlurmHook, "query_jobs", lambda self, ids, pending=(): JobQuery({"7": running}))
    answer = sources._slurm_fetch("slurm", None)(["7"])
    assert answer["7"]["usage"] == used.to_dict()

    tasks = [r.LiveTask("d", "run", "t", -1, 1, "deferred", {"slurm_job": _own_handle("7")}, {}, "v1")]
    monkeypatch.setattr(sources, "live_tasks", lambda: tasks)
    monkeypatch.setattr(sources, "task_settings", lambda version, task, attr: trusted_jobs.TaskSettings("slurm"))
    config = SlurmConnectionConfig(conn_id="slurm", hosts=(("h", 22),), user="npa", results_root="/r")
    monkeypatch.setattr(sources, "_slurm_configs", lambda ids: dict.fromkeys(ids, config))

    class Cache:
        def __init__(self, value):
            self.value = json.loads(json.dumps(value))  # as the cache file holds it

        def get(self, key, items, fetch, wait=0.5):
            return CachedAnswer(1.0, tuple(items), self.value)

    (shown,) = sources.snapshot(Cache(answer), now=2.0).rows
    assert (shown.gpu_hours, shown.gpu_hours_from) == (4.0, "cluster")
    no_usage = {"7": {**answer["7"], "usage": None}}
    (unknown,) = sources.snapshot(Cache(no_usage), now=2.0).rows
    assert unknown.gpu_hours is None and "no accounting record" in unknown.gpu_hours_unknown


def test_the_task_s_npa_usage_is_read_with_its_handle_in_one_query(monkeypatch):
    """One database read for the whole page: the handles and npa_usage of every live task instance; a report is
    kept as it is (the rows judge it), one that does not decode is kept as unreadable, and a task with a report
    but no handle has no row."""
    from npa_airflow.common.xcom_keys import USAGE

    def xcom(task_id, key, value):
        return types.SimpleNamespace(
            dag_id="d", run_id="run", task_id=task_id, map_index=-1, try_number=1, state="up_for_retry",
            dag_version_id="v1", key=key, value=value, rendered_fields=None,
        )  # fmt: skip

    handle = {"conn_id": "slurm", "job_id": "7"}
    rows = [
        xcom("t", "slurm_job", json.dumps(handle)),
        xcom("t", USAGE, json.dumps({"gpu_hours": 2.5, "segments": [{"segment": 1}]})),
        xcom("u", "slurm_job", json.dumps(handle)),
        xcom("u", USAGE, '{"__classname__": "no.such.Class", "__version__": 1, "__data__": {}}'),
        xcom("w", USAGE, json.dumps({"gpu_hours": 1.0})),  # no handle: not on the page
    ]
    queries = []

    class Session:
        def execute(self, query):
            queries.append(query)
            return rows

    monkeypatch.setattr(sources, "create_session", lambda: contextlib.nullcontext(Session()))
    tasks = {t.task_id: t for t in sources.live_tasks()}
    (query,) = queries
    sql = str(query.compile(compile_kwargs={"literal_binds": True}))
    assert "'npa_usage'" in sql and "'slurm_job'" in sql and "'burst_job'" in sql
    assert sorted(tasks) == ["t", "u"]
    assert tasks["t"].handles == {"slurm_job": handle}
    assert tasks["t"].reported == {USAGE: {"gpu_hours": 2.5, "segments": [{"segment": 1}]}}
    assert tasks["u"].reported[USAGE] == sources.UNREADABLE
