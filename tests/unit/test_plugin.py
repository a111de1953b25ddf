"""The listener plugin acts only on task instances that have ended for good, only in the API server, and only on
the jobs it derives as theirs (npa_airflow.trusted_jobs)."""

from __future__ import annotations

import asyncio
import json
import time
import types

import pytest

from npa_airflow import plugin, trusted_jobs
from npa_airflow.common.deployment import current_deployment
from npa_airflow.common.naming import job_name_for
from npa_airflow.trusted_jobs import TaskSettings

CONN = {
    "conn_type": "slurm",
    "host": "h",
    "login": "npa",
    "extra": {"results_root": "/r", "cluster_name": "b", "insecure_skip_host_key_check": True},
}


def test_the_plugin_is_registered_with_airflow():
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="airflow.plugins") if e.name == "npa_airflow"]
    loaded = entry.load()
    assert loaded is plugin.NpaAirflowPlugin and plugin in loaded.listeners


def test_a_worker_s_task_instance_is_left_to_its_operator(monkeypatch):
    monkeypatch.setattr(plugin, "_handles", lambda ti: pytest.fail("a worker's task instance must not be looked up"))
    runtime_ti = types.SimpleNamespace(state="failed", task_id="t")  # not airflow.models.taskinstance
    assert plugin.cancel_jobs_of(runtime_ti) is None


def _ti(monkeypatch, state="failed", map_index=-1, try_number=2, run_id="scheduled__2026-12-04T00:00:00+00:00"):
    from airflow.models.taskinstance import TaskInstance

    ti = TaskInstance.__new__(TaskInstance)
    for name, value in dict(
        state=state, dag_id="train_daily", task_id="train", run_id=run_id, map_index=map_index,
        try_number=try_number, dag_version_id="v1",
    ).items():  # fmt: skip
        monkeypatch.setattr(TaskInstance, name, value, raising=False)
    return ti


@pytest.mark.parametrize("state", ["up_for_retry", "running", "deferred", None, "queued"])
def test_a_task_instance_that_has_not_ended_for_good_is_left_alone(monkeypatch, state):
    monkeypatch.setattr(plugin, "_handles", lambda ti: pytest.fail(f"looked up a {state} task instance"))
    assert plugin.cancel_jobs_of(_ti(monkeypatch, state)) is None


def name(try_number: int = 1) -> str:
    return job_name_for("train_daily", "train", "scheduled__2026-12-04T00:00:00+00:00", -1, try_number,
                        deployment=current_deployment())  # fmt: skip


def handle(job_id: str = "7", **changes) -> dict:
    job = changes.pop("job_name", name(1))
    return {
        "conn_id": "slurm_unitp", "cluster": "b", "job_id": job_id, "job_name": job, "login_host": "h:22",
        "results_dir": f"/r/{job}", "stdout_path": f"/r/slurm-logs/{job}/main.out",
        "stderr_path": f"/r/slurm-logs/{job}/main.err", "try_number": 1, "script_path": f"/r/sbatch/{job}.sbatch",
        "env_file": f"/r/sidecars/{job}.env", **changes,
    }  # fmt: skip


@pytest.fixture
def slurm_side(monkeypatch):
    """The serialized task names connection slurm_unitp; cancels are recorded instead of sent."""
    from npa_airflow.slurm.transport.async_hook import AsyncSlurmHook  # the hook of the cluster's channel

    monkeypatch.setenv("AIRFLOW_CONN_SLURM_UNITP", json.dumps(CONN))
    monkeypatch.setattr(trusted_jobs, "task_settings", lambda version, task, attr: TaskSettings("slurm_unitp"))
    sent: list = []

    async def acancel_many(self, requests):
        sent.append([(self.cluster, r.job_id, r.job_name, r.marker, r.shred) for r in requests])
        await asyncio.sleep(0.05)  # a round trip
        return dict.fromkeys(requests, "cancelled")

    monkeypatch.setattr(AsyncSlurmHook, "acancel_many", acancel_many)
    return sent


@pytest.mark.parametrize("state", ["failed", "success"])
def test_an_ended_task_instance_s_own_job_is_cancelled_with_its_derived_marker_and_sidecar(
    monkeypatch, slurm_side, state
):
    """So that clearing the task later runs it again instead of failing on a cancel "outside Airflow"."""
    ti = _ti(monkeypatch, state)
    monkeypatch.setattr(plugin, "_handles", lambda ti: {"slurm_job": handle()})
    plugin.cancel_jobs_of(ti).result(10)
    job = name(1)
    assert slurm_side == [[("b", "7", job, f"/r/sbatch/{job}.sbatch.npa-cancelled", (f"/r/sidecars/{job}.env",))]]


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        (handle(conn_id="other_cluster"), "connection 'other_cluster' is not the task's"),
        (handle(job_name="npa-someone-elses-0123456789-t1"), "is not the name of any try"),
        (handle(job_name=name(3)), "is not the name of any try"),  # a try that has not happened
        (handle(cluster="c"), "cluster 'c' is not the connection's"),
        ({k: v for k, v in handle().items() if k != "conn_id"}, "malformed Slurm job handle"),
        ("not a handle", "malformed Slurm job handle"),
    ],
)
def test_a_handle_that_is_not_the_task_instance_s_own_cancels_nothing(monkeypatch, slurm_side, caplog, forged, why):
    monkeypatch.setattr(plugin, "_handles", lambda ti: {"slurm_job": forged})
    with caplog.at_level("WARNING", logger=plugin.__name__):
        assert plugin.cancel_jobs_of(_ti(monkeypatch)) is None
    assert slurm_side == []
    assert why in caplog.text


def test_paths_the_layout_does_not_derive_are_dropped_and_the_job_is_still_cancelled(monkeypatch, slurm_side, caplog):
    forged = handle(script_path="/home/victim/.bashrc", env_file="/etc/passwd")
    monkeypatch.setattr(plugin, "_handles", lambda ti: {"slurm_job": forged})
    with caplog.at_level("WARNING", logger=plugin.__name__):
        plugin.cancel_jobs_of(_ti(monkeypatch)).result(10)
    assert slurm_side == [[("b", "7", name(1), None, ())]]  # no marker, no shred outside the layout
    assert "/home/victim/.bashrc" in caplog.text and "/etc/passwd" in caplog.text


def test_a_run_of_many_tasks_marked_failed_cancels_their_jobs_in_a_few_batches_without_a_thread_each(
    monkeypatch, slurm_side
):
    """Airflow calls the listener once per task instance; their cancels share scancel round trips on the one
    background loop, and the listener returns at once."""
    import threading

    ids = iter(range(100, 140))
    monkeypatch.setattr(plugin, "_handles", lambda ti: {"slurm_job": handle(str(next(ids)))})
    ti = _ti(monkeypatch)
    plugin.cancel_jobs_of(ti).result(10)  # the background loop runs
    before = threading.active_count()
    started = time.monotonic()
    futures = [plugin.cancel_jobs_of(ti) for _ in range(39)]
    assert time.monotonic() - started < 5
    assert threading.active_count() == before
    for future in futures:
        future.result(30)
    assert sum(len(b) for b in slurm_side) == 40 and len(slurm_side) <= 5, [len(b) for b in slurm_side]


def test_a_burst_handle_is_acted_on_only_as_the_try_it_derives(monkeypatch, caplog):
    from npa_airflow.burst.tries import try_refs

    monkeypatch.setattr(trusted_jobs, "task_settings", lambda version, task, attr: TaskSettings("sky", teardown=None))
    cancelled = []

    async def cancel(settings, ref):
        cancelled.append((settings.conn_id, ref.try_number, ref.cluster))

    monkeypatch.setattr(plugin, "_cancel_burst", cancel)
    ti = _ti(monkeypatch)
    (first, _second) = try_refs(("train_daily", "train", ti.run_id, -1, 2), current_deployment(), None)
    burst = {"conn_id": "sky", "endpoint": "https://sky", "cluster": first.cluster, "name": "n",
             "request_id": "0123456789abcdef", "try_name": first.try_name}  # fmt: skip
    monkeypatch.setattr(plugin, "_handles", lambda ti: {"burst_job": burst})
    plugin.cancel_jobs_of(ti).result(10)
    assert cancelled == [("sky", 1, first.cluster)]
    for forged in ({**burst, "cluster": "someone-elses"}, {**burst, "conn_id": "other"}):
        monkeypatch.setattr(plugin, "_handles", lambda ti, forged=forged: {"burst_job": forged})
        with caplog.at_level("WARNING", logger=plugin.__name__):
            assert plugin.cancel_jobs_of(ti) is None
    assert cancelled == [("sky", 1, first.cluster)]
    assert "is not one of this task instance's tries" in caplog.text and "'other' is not the task's" in caplog.text


def test_the_identity_is_created_when_a_scheduler_starts_and_never_from_a_task(monkeypatch):
    from npa_airflow.common import deployment

    created = []
    monkeypatch.setattr(deployment, "ensure_identity", lambda: created.append(1))
    plugin.on_starting(types.SimpleNamespace())  # a task runner's marker
    assert created == []
    job = type("Job", (), {"__module__": "airflow.jobs.job"})()
    plugin.on_starting(job)
    assert created == [1]
