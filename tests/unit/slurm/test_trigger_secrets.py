"""SlurmJobTrigger and a job's secrets: masked in what it logs and fires, its sidecar gone with every cancel.

The trigger resolves the `secret_env` references itself (Variables from AIRFLOW_VAR_* here) and registers the
values with this process's real Airflow secrets masker. Job states come from `LocalClusterDouble`; log files are
real files read by the real tail command in local bash.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.slurm.watch.poller import get_poller
from tests.harness.cluster_double import LocalClusterDouble
from tests.supervisor_double import install_supervisor, run_for_task_instance
from tests.unit.slurm.test_triggers import first_event, handle_for, logged_lines, make_trigger, start_watching

pytestmark = pytest.mark.usefixtures("fast_poller")  # tests/unit/slurm/conftest.py


@pytest.fixture
def double() -> LocalClusterDouble:
    return LocalClusterDouble()


@pytest.fixture
def supervisor(monkeypatch):
    """The metadata database as on_kill reads it: the task instance was marked failed."""
    return install_supervisor(monkeypatch, "failed")


@pytest.fixture
def secrets(monkeypatch) -> dict[str, str]:
    """Three Variables whose names Airflow does not consider sensitive (so only an explicit mask hides them)."""
    tag = uuid.uuid4().hex
    values = {
        "plain": f"plain-{tag}",
        "multi": f"first-{tag}\nsecond-{tag}\n",
        "regex": f"a.b*c(d)+[e]?$f^g|h\\i-{tag}",
    }
    for name, value in values.items():
        monkeypatch.setenv(f"AIRFLOW_VAR_NPA_UNIT_{name}_{tag}".upper(), value)
    return {f"NPA_{name.upper()}": (f"var:npa_unit_{name}_{tag}", value) for name, value in values.items()}


def job_output(secrets: dict[str, tuple[str, str]]) -> bytes:
    """What `echo "key=$PLAIN"; env; printf '%s' "$MULTI"` and friends print."""
    plain, multi, regex = (value for _, value in secrets.values())
    return f"key={plain}\nNPA_REGEX={regex}\nNPA_MULTI={multi}then {regex} again\n".encode()


async def test_a_job_printing_its_secrets_shows_masks_in_the_log_and_the_event(tmp_path, double, secrets, caplog):
    caplog.set_level(logging.INFO)
    handle = handle_for(tmp_path)
    Path(handle["stdout_path"]).write_bytes(job_output(secrets))
    double.states["42"] = JobState.ERROR
    refs = {name: ref for name, (ref, _) in secrets.items()}
    trigger = make_trigger(handle, double, secret_env=refs)
    assert trigger.serialize()[1]["secret_env"] == refs  # references travel, values never do
    event = await first_event(trigger, double)

    text = "\n".join(logged_lines(caplog)) + "\n" + event.payload["log_tail"]
    for _, value in secrets.values():
        for fragment in value.splitlines():
            assert fragment not in text
    assert "key=***" in logged_lines(caplog) and "then *** again" in logged_lines(caplog)
    assert str(secrets) not in str(trigger.serialize())


async def test_secrets_that_cannot_be_read_mean_no_output_is_copied(tmp_path, double, caplog):
    caplog.set_level(logging.INFO)
    handle = handle_for(tmp_path)
    Path(handle["stdout_path"]).write_bytes(b"the job prints something\n")
    double.states["42"] = JobState.ERROR
    trigger = make_trigger(handle, double, secret_env={"NPA_GONE": f"var:npa_gone_{uuid.uuid4().hex}"})
    event = await first_event(trigger, double)
    assert event.payload["status"] == "failed" and event.payload["log_tail"] == ""
    assert "the job prints something" not in logged_lines(caplog)
    assert any("could not be read to mask them" in r.getMessage() for r in caplog.records)


async def test_values_resolved_by_the_worker_are_used_as_they_are(tmp_path, double, caplog):
    """The non-deferrable wait: the operator hands the trigger the values it resolved (never via kwargs)."""
    caplog.set_level(logging.INFO)
    secret = f"worker-{uuid.uuid4().hex}"
    handle = handle_for(tmp_path)
    Path(handle["stdout_path"]).write_bytes(f"token {secret}\n".encode())
    double.states["42"] = JobState.COMPLETE
    trigger = make_trigger(handle, double, secret_env={"NPA_T": f"var:npa_not_set_{uuid.uuid4().hex}"})
    trigger.use_resolved_secrets([secret])
    await first_event(trigger, double)
    assert "token ***" in logged_lines(caplog)


# -- the sidecar goes with every cancel ---------------------------------------------------------------------


def with_sidecar(tmp_path: Path) -> tuple[dict, Path]:
    sidecar = tmp_path / "sidecars" / "job.env"
    sidecar.parent.mkdir()
    sidecar.write_text("export NPA_SECRET=x\n")
    return handle_for(tmp_path, env_file=str(sidecar)), sidecar


async def test_the_deadline_cancel_shreds_the_sidecar(tmp_path, double):
    handle, sidecar = with_sidecar(tmp_path)
    double.states["42"] = JobState.PENDING
    event = await first_event(make_trigger(handle, double, deadline=time.time() + 0.3), double)
    assert event.payload["status"] == "deadline" and double.states["42"] is JobState.CANCELED
    assert not sidecar.exists()


async def test_a_user_kill_shreds_the_sidecar(tmp_path, double, supervisor):
    handle, sidecar = with_sidecar(tmp_path)
    double.states["42"] = JobState.RUNNING
    trigger = run_for_task_instance(make_trigger(handle, double))
    task = await start_watching(trigger, double)
    task.cancel()
    await trigger.on_kill()
    assert double.states["42"] is JobState.CANCELED and not sidecar.exists()


async def test_a_user_kill_after_the_job_ended_shreds_the_sidecar_too(tmp_path, double, supervisor):
    handle, sidecar = with_sidecar(tmp_path)
    double.states["42"] = JobState.ERROR
    get_poller("slurm_test", lambda _: double)
    await run_for_task_instance(make_trigger(handle, double)).on_kill()
    assert double.shredded == [str(sidecar)] and not sidecar.exists()
