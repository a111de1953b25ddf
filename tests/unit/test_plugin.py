"""The listener plugin acts only on task instances that have ended for good, and only in the API server."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from npa_airflow import plugin


def test_the_plugin_is_registered_with_airflow():
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="airflow.plugins") if e.name == "npa_airflow"]
    loaded = entry.load()
    assert loaded is plugin.NpaAirflowPlugin and plugin in loaded.listeners


def test_a_worker_s_task_instance_is_left_to_its_operator(monkeypatch):
    monkeypatch.setattr(plugin, "_handles", lambda ti: pytest.fail("a worker's task instance must not be looked up"))
    runtime_ti = types.SimpleNamespace(state="failed", task_id="t")  # not airflow.models.taskinstance
    assert plugin.cancel_jobs_of(runtime_ti) is None


@pytest.mark.parametrize("state", ["up_for_retry", "running", "deferred", None, "queued"])
def test_a_task_instance_that_has_not_ended_for_good_is_left_alone(monkeypatch, state):
    from airflow.models.taskinstance import TaskInstance

    monkeypatch.setattr(plugin, "_handles", lambda ti: pytest.fail(f"looked up a {state} task instance"))
    ti = TaskInstance.__new__(TaskInstance)
    monkeypatch.setattr(TaskInstance, "state", state, raising=False)
    assert plugin.cancel_jobs_of(ti) is None


@pytest.mark.parametrize("state", ["failed", "success"])
def test_an_ended_task_instance_has_each_of_its_jobs_cancelled(monkeypatch, state):
    from airflow.models.taskinstance import TaskInstance

    cancelled = []
    handles = {"burst_job": {"cluster": "c"}, "slurm_job": {"job_id": "7"}}
    monkeypatch.setattr(plugin, "_handles", lambda ti: handles)
    monkeypatch.setitem(plugin.CANCELLERS, "slurm_job", lambda h: cancelled.append(("slurm", h)))
    monkeypatch.setitem(plugin.CANCELLERS, "burst_job", lambda h: 1 / 0)  # one failure does not stop the rest
    ti = TaskInstance.__new__(TaskInstance)
    monkeypatch.setattr(TaskInstance, "state", state, raising=False)
    monkeypatch.setattr(TaskInstance, "task_id", "t", raising=False)
    thread = plugin.cancel_jobs_of(ti)
    thread.join(10)
    assert cancelled == [("slurm", {"job_id": "7"})]


def test_a_slurm_cancel_records_that_airflow_made_it_and_reports_what_happened(monkeypatch, caplog):
    """So that clearing the task later runs it again instead of failing on a cancel "outside Airflow"."""
    from npa_airflow.slurm.hook import SlurmHook

    calls = []

    async def acancel_many(self, requests):
        calls.extend((self.cluster, r.job_id, r.marker, r.shred) for r in requests)
        return dict.fromkeys(requests, "ended")

    monkeypatch.setattr(SlurmHook, "acancel_many", acancel_many)
    with caplog.at_level("INFO", logger=plugin.__name__):
        plugin.cancel_slurm_job(_handle("7"))
    marker = "/r/sbatch/npa-x-0123456789-t1.sbatch.npa-cancelled"
    assert calls == [("b", "7", marker, ("/r/x/.npa-secrets.env",))]  # on the job's cluster, its sidecar shredded
    assert "had already ended: nothing to cancel" in caplog.text and "Cancelled" not in caplog.text


def test_a_run_of_many_tasks_marked_failed_cancels_their_jobs_in_a_few_batches(monkeypatch):
    """Airflow calls the listener once per task instance; the threads' cancels share scancel round trips."""
    from npa_airflow.slurm.hook import SlurmHook

    batches = []

    async def acancel_many(self, requests):
        batches.append(len(requests))
        await asyncio.sleep(0.05)  # a round trip
        return dict.fromkeys(requests, "cancelled")

    monkeypatch.setattr(SlurmHook, "acancel_many", acancel_many)
    threads = [threading.Thread(target=plugin.cancel_slurm_job, args=(_handle(str(100 + i)),)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(batches) == 40 and len(batches) <= 4, batches


def _handle(job_id: str) -> dict:
    return {
        "conn_id": "slurm_default", "cluster": "b", "job_id": job_id, "job_name": "npa-x-0123456789-t1",
        "login_host": "h:22", "results_dir": "/r/x", "stdout_path": "/r/x.out", "stderr_path": "/r/x.err",
        "try_number": 1, "script_path": "/r/sbatch/npa-x-0123456789-t1.sbatch", "env_file": "/r/x/.npa-secrets.env",
    }  # fmt: skip
