"""What an operator sees and does in the Airflow UI for a Slurm task, through the REST API the UI uses.

Each test triggers the test DAG `npa_e2e_slurm` (tests/e2e/dags/): one SlurmSubmitOperator whose job prints
"tick <i> of <n>" once a second on the local cluster. The cluster side is checked with sacct over ssh.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.airflow_api import poll
from tests.e2e.slurm_runs import DAG_ID, TASK_ID, start_job, ticks, wait_for_ticks


@pytest.fixture(scope="module")
def watched_run(api, wait_sacct):
    """One run watched while DEFERRED: what the log, links, XCom and rendered template show mid-job."""
    run_id, ti, job_id = start_job(api, seconds=25)
    wait_sacct(job_id, ("RUNNING",), timeout=60)
    lines = wait_for_ticks(api, run_id, ti["try_number"], at_least=3)
    seen = {
        "lines": lines,
        "state_after_log": api.task_instance(DAG_ID, run_id, TASK_ID)["state"],
        "links": api.extra_links(DAG_ID, run_id, TASK_ID),
        "ti": api.task_instance(DAG_ID, run_id, TASK_ID),
        "handle": api.xcom(DAG_ID, run_id, TASK_ID, "slurm_job"),
    }
    return run_id, job_id, seen


def test_remote_stdout_streams_into_the_log_while_deferred(watched_run):
    _, _, seen = watched_run
    assert seen["state_after_log"] == "deferred", "the ticks must be visible while the task is still waiting"
    got = ticks(seen["lines"])
    assert got == list(range(1, len(got) + 1)), f"ticks out of order or duplicated: {got}"


def test_extra_link_is_there_while_waiting(watched_run):
    _, _, seen = watched_run
    links = seen["links"]
    assert links.get("Slurm job"), f"no 'Slurm job' extra link while deferred: {links}"


def test_xcom_shows_the_job_handle(watched_run):
    _, job_id, seen = watched_run
    handle = seen["handle"]
    assert handle["job_id"] == job_id
    assert handle["job_name"].startswith("npa-")
    assert handle["stdout_path"].startswith("/") and handle["results_dir"].startswith("/")


def test_rendered_template_shows_the_sbatch_script_without_secrets(watched_run, e2e_secret):
    _, _, seen = watched_run
    rendered = seen["ti"]["rendered_fields"]
    scripts = [v for v in rendered.values() if isinstance(v, str) and v.startswith("#!")]
    assert scripts, f"no rendered sbatch script among the template fields: {sorted(rendered)}"
    script = scripts[0]
    assert "#SBATCH" in script and "tick" in script
    assert e2e_secret not in str(rendered), "a secret reached the rendered template fields"


def test_the_watched_run_completes_with_every_line_once_in_order(api, watched_run, e2e_secret):
    run_id, _, _ = watched_run
    ti = api.wait_for_state(DAG_ID, run_id, TASK_ID, {"success"}, timeout=120)
    lines = api.log_lines(DAG_ID, run_id, TASK_ID, ti["try_number"])
    assert ticks(lines) == list(range(1, 26)), lines
    assert not any(e2e_secret in line for line in lines), "a secret reached the task log"


@pytest.mark.parametrize("new_state", ["failed", "success"])
def test_marking_a_waiting_task_cancels_the_slurm_job(api, wait_sacct, new_state):
    run_id, ti, job_id = start_job(api, seconds=120)
    # As a user would: the job's output is in the log view (so the trigger is watching it), then mark.
    wait_for_ticks(api, run_id, ti["try_number"], at_least=2)
    marked_at = time.monotonic()
    api.set_state(DAG_ID, run_id, TASK_ID, new_state)
    state = wait_sacct(job_id, ("CANCELLED",), timeout=30)
    print(f"[e2e] mark {new_state} -> {state} in {time.monotonic() - marked_at:.1f}s")
    assert api.task_instance(DAG_ID, run_id, TASK_ID)["state"] == new_state


def test_clearing_a_waiting_task_cancels_the_slurm_job(api, wait_sacct):
    run_id, ti, job_id = start_job(api, seconds=120)
    wait_for_ticks(api, run_id, ti["try_number"], at_least=2)
    api.request(
        "POST",
        f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
        json={"dry_run": False, "dag_run_id": run_id, "task_ids": [TASK_ID], "only_failed": False},
    )
    wait_sacct(job_id, ("CANCELLED",), timeout=30)
    # The cleared task runs again as a new try with a new job: stop that one too.
    retry = api.wait_for_state(DAG_ID, run_id, TASK_ID, {"deferred"}, timeout=120)
    assert retry["try_number"] == ti["try_number"] + 1
    new_job = poll(
        lambda: (h := api.xcom(DAG_ID, run_id, TASK_ID, "slurm_job")) and str(h["job_id"]) != job_id and h,
        30,
        "the new try's job handle",
    )
    # The new try may have reattached to the old job first (its lines are in this try's log too): wait for
    # lines printed after the new job was seen, i.e. the new job's own output, before marking.
    seen = len(ticks(api.log_lines_while_unfinished(DAG_ID, run_id, TASK_ID, retry["try_number"])))
    wait_for_ticks(api, run_id, retry["try_number"], at_least=seen + 2)
    api.set_state(DAG_ID, run_id, TASK_ID, "failed")
    wait_sacct(str(new_job["job_id"]), ("CANCELLED", "COMPLETED"), timeout=30)


def test_triggerer_restart_keeps_the_job_and_does_not_replay_the_log(airflow, api, sacct_state):
    run_id, ti, job_id = start_job(api, seconds=30)
    wait_for_ticks(api, run_id, ti["try_number"], at_least=3)
    airflow.kill_triggerer()
    time.sleep(3)
    assert sacct_state(job_id) == "RUNNING", "killing the triggerer must not touch the Slurm job"
    airflow.start_triggerer()
    done = api.wait_for_state(DAG_ID, run_id, TASK_ID, {"success"}, timeout=180)
    assert sacct_state(job_id) == "COMPLETED"
    lines = api.log_lines(DAG_ID, run_id, TASK_ID, done["try_number"])
    assert ticks(lines) == list(range(1, 31)), f"log replayed or lost lines across the restart: {ticks(lines)}"
