"""The secrets sidecar lives while Slurm may run the job again and goes once the job has ended for good.

The rendered script runs in real bash with the stand-ins of test_slurm_scripts (no Slurm daemon in a unit test);
the shred builders run in real local bash; the poller is driven by `LocalClusterDouble` (scripted job states, real
shell for every command). tests/integration/test_slurm_secrets.py proves the same against the real cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm import commands as c
from npa_airflow.slurm.submit.scripts import render_sbatch
from npa_airflow.slurm.watch import poller as poller_mod
from npa_airflow.slurm.watch.poller import SlurmPoller
from tests.harness.cluster_double import LocalClusterDouble
from tests.unit.slurm.submit.test_slurm_scripts import make, run_script


def sidecar_in(tmp_path: Path) -> Path:
    path = tmp_path / "sidecars" / "job.env"
    path.parent.mkdir(exist_ok=True)
    path.write_text("export NPA_SECRET=the-session-token\n")
    path.chmod(0o600)
    return path


# -- the script ---------------------------------------------------------------------------------------------


def test_a_successful_run_shreds_the_sidecar(tmp_path):
    sidecar = sidecar_in(tmp_path)
    proc, results = run_script(tmp_path, make(tmp_path, 'test -n "$NPA_SECRET"', env_file=str(sidecar)))
    assert proc.returncode == 0, proc.stderr
    assert (results / "status.json").exists() and not sidecar.exists()


def test_a_failed_run_of_a_requeueable_job_keeps_the_sidecar_for_the_next_run(tmp_path):
    sidecar = sidecar_in(tmp_path)
    spec = make(tmp_path, 'test -n "$NPA_SECRET"; exit 3', env_file=str(sidecar))
    proc, _ = run_script(tmp_path, spec)
    assert proc.returncode == 3 and sidecar.exists()  # a node failure looks the same from here: Slurm may requeue
    proc, _ = run_script(tmp_path, make(tmp_path, 'test -n "$NPA_SECRET"', env_file=str(sidecar)))
    assert proc.returncode == 0, proc.stderr  # the next run still has its secret
    assert not sidecar.exists()


def controller_says(tmp_path: Path, line: str) -> None:
    """What the scontrol stand-in answers to `scontrol show job -o <id>` (run_script's job id is 4242)."""
    (tmp_path / "scontrol-job").write_text(line + "\n")


@pytest.mark.parametrize(
    "answer",
    [
        "JobId=4242 JobName=npa-t-0123456789-t1 UserId=npa(1001) JobState=PENDING Reason=BeginTime Restarts=1",
        "JobId=4242 JobName=npa-t-0123456789-t1 UserId=npa(1001) JobState=CANCELLED Reason=None Restarts=0",
    ],
    ids=["requeued", "cancelled"],
)
def test_srun_returning_0_for_a_run_slurm_ended_is_not_a_success(tmp_path, answer):
    """Seen on the real cluster: a node failure that requeues the job ends srun with 0 before the batch script is
    signalled; that run wrote status.json and shredded the sidecar under the next run."""
    sidecar = sidecar_in(tmp_path)
    controller_says(tmp_path, answer)
    proc, results = run_script(tmp_path, make(tmp_path, "true", env_file=str(sidecar)))
    assert proc.returncode == 143 and "srun returned 0 for a run Slurm ended" in proc.stderr, proc.stderr
    assert not (results / "status.json").exists() and sidecar.exists()


@pytest.mark.parametrize(
    "answer",
    [
        "JobId=4242 JobName=npa-t-0123456789-t1 UserId=npa(1001) JobState=RUNNING Reason=None Restarts=0",
        # the same id on another cluster (a wrong SLURM_CONF): not an answer about this job
        "JobId=4242 JobName=someone-elses UserId=ann(1002) JobState=COMPLETED Reason=None Restarts=0",
        "",  # no answer: the controller did not reply
    ],
    ids=["running", "another-job", "no-answer"],
)
def test_srun_returning_0_is_a_success_while_slurm_runs_this_run(tmp_path, answer):
    sidecar = sidecar_in(tmp_path)
    controller_says(tmp_path, answer)
    proc, results = run_script(tmp_path, make(tmp_path, "true", env_file=str(sidecar)))
    assert proc.returncode == 0, proc.stderr
    assert (results / "status.json").exists() and not sidecar.exists()


def test_a_run_killed_by_a_signal_keeps_the_sidecar(tmp_path):
    """slurmd ends a requeued or preempted run with SIGTERM to every process of the job."""
    sidecar = sidecar_in(tmp_path)
    started = tmp_path / "started"
    spec = make(tmp_path, f"touch {started}; sleep 30", env_file=str(sidecar))
    script = tmp_path / "job.sbatch"
    run_script(tmp_path, make(tmp_path, "true"))  # installs the srun/scontrol stand-ins
    script.write_text(render_sbatch(spec))
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "NPA_TEST_DIR": str(tmp_path)}
    proc = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert sidecar.exists()


def test_a_job_that_is_never_requeued_shreds_the_sidecar_on_any_exit(tmp_path):
    sidecar = sidecar_in(tmp_path)
    proc, _ = run_script(tmp_path, make(tmp_path, "exit 3", env_file=str(sidecar), requeue=False))
    assert proc.returncode == 3 and not sidecar.exists()


# -- a requeue is not an end ---------------------------------------------------------------------------------


def test_a_node_fail_that_squeue_shows_queued_again_is_not_an_end():
    """As measured on the local cluster: sacct says NODE_FAIL ~4 s while squeue already says PENDING."""
    accounted = c.parse_sacct(
        "7|7|NODE_FAIL|1:0|c1|None|5|cpu=1,node=1|npa-x-t1\n8|8|NODE_FAIL|1:0|c2|None|5|cpu=1,node=1|npa-y-t1\n"
    )
    assert [c.may_run_again(accounted[i]) for i in ("7", "8")] == [True, True]
    live = c.parse_squeue("7|7|PENDING|BeginTime|(null)|npa-x-t1\n8|8|NODE_FAIL|NodeDown|c2|npa-y-t1\n")
    merged = c.merge_live_states(accounted, live, ["7", "8"])
    assert merged["7"].state is JobState.PENDING and merged["7"].source == "squeue"
    assert merged["8"].state is JobState.ERROR and merged["8"].source == "sacct"  # not requeued: the end
    assert c.merge_live_states(accounted, {}, ["7"])["7"].native_state == "NODE_FAIL"  # squeue forgot it
    assert "7" not in c.merge_live_states(accounted, None, ["7"])  # slurmctld silent: unknown, not ended
    failed = c.parse_sacct("9|9|FAILED|3:0|c1|None|5|cpu=1,node=1|npa-z-t1\n")["9"]
    assert not c.may_run_again(failed)


# -- the builders -------------------------------------------------------------------------------------------


def test_shred_builder_removes_files_silently_and_never_fails(tmp_path):
    hostile = tmp_path / "a b$(touch pwned)'\";x.env"
    hostile.write_text("secret")
    plain = tmp_path / "plain.env"
    plain.write_text("secret")
    command = c.build_shred_files([str(hostile), str(plain), str(tmp_path / "missing.env")])
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # both gone, nothing created
    for bad in (["relative.env"], ["/a\nb"]):
        with pytest.raises(NpaValidationError):
            c.build_shred_files(bad)


@pytest.mark.parametrize(("scancel_rc", "kept"), [(0, False), (1, True)])
def test_cancel_and_shred_shreds_only_after_scancel_succeeded(tmp_path, scancel_rc, kept):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scancel").write_text(f'#!/bin/bash\necho "scancel $*" >&2\nexit {scancel_rc}\n')
    (bindir / "scancel").chmod(0o755)
    sidecar = sidecar_in(tmp_path)
    command = c.build_cancel_and_shred(["42"], [str(sidecar)], cluster="west")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == scancel_rc and proc.stderr == "scancel -M west 42\n"
    assert sidecar.exists() is kept
    assert c.build_cancel_and_shred(["42"], []) == "scancel 42"


# -- the poller ---------------------------------------------------------------------------------------------


def drain(reg) -> list:
    out = []
    while not reg.queue.empty():
        out.append(reg.queue.get_nowait())
    return out


async def test_the_poller_shreds_in_the_tail_command_of_the_cycle_that_sees_the_end(tmp_path):
    double = LocalClusterDouble()
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    out = tmp_path / "job.out"
    out.write_text("line\n")
    sidecar = sidecar_in(tmp_path)
    reg = poller.register("8", log_offsets=[(str(out), 0)], shred_on_end=[str(sidecar)])
    double.states["8"] = JobState.RUNNING
    await poller.cycle()
    assert sidecar.exists() and drain(reg)[0].state is JobState.RUNNING

    double.states["8"] = JobState.ERROR
    commands_before = len(double.commands)
    await poller.cycle()
    (update,) = drain(reg)
    assert update.state is JobState.ERROR and update.logs_drained
    assert not sidecar.exists()
    assert len(double.commands) == commands_before + 1  # no round trip of its own: it rode in the tail command
    assert poller.stats.files_shredded == 1
    await poller.cycle()
    assert "shred -u" not in double.commands[-1]  # once


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN])
async def test_a_job_that_may_still_run_keeps_its_sidecar(tmp_path, state):
    """REQUEUED and REQUEUE_HOLD read as PENDING, a requeued PREEMPTED as squeue's COMPLETING or PENDING
    (npa_airflow.slurm.commands.states)."""
    double = LocalClusterDouble()
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    sidecar = sidecar_in(tmp_path)
    poller.register("8", shred_on_end=[str(sidecar)])
    double.states["8"] = state
    await poller.cycle()
    assert sidecar.exists() and not any("shred -u" in cmd for cmd in double.commands)


async def test_a_job_cancelled_before_it_ever_ran_loses_its_sidecar(tmp_path):
    double = LocalClusterDouble()
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    out = tmp_path / "job.out"  # never created: the job never started
    sidecar = sidecar_in(tmp_path)
    reg = poller.register("8", log_offsets=[(str(out), 0)], shred_on_end=[str(sidecar)])
    double.states["8"] = JobState.PENDING
    await poller.cycle()
    double.states["8"] = JobState.CANCELED
    await poller.cycle()
    assert [u.state for u in drain(reg)] == [JobState.PENDING, JobState.CANCELED]
    assert not sidecar.exists()


async def test_the_end_is_reported_only_after_the_shred_went_through(tmp_path, monkeypatch):
    double = LocalClusterDouble()
    poller = SlurmPoller("c1", lambda _: double, autostart=False)
    sidecar = sidecar_in(tmp_path)
    reg = poller.register("8", shred_on_end=[str(sidecar)])
    double.states["8"] = JobState.COMPLETE
    double.fail_commands = 1
    await poller.cycle()
    (update,) = drain(reg)
    assert not update.logs_drained and sidecar.exists()  # the trigger keeps waiting for the next cycle
    await poller.cycle()
    (update,) = drain(reg)
    assert update.logs_drained and not sidecar.exists()

    other = sidecar_in(tmp_path / "sidecars")
    reg = poller.register("9", shred_on_end=[str(other)])
    double.states["9"] = JobState.COMPLETE
    double.fail_commands = poller_mod.MAX_SHRED_ATTEMPTS
    updates = []
    for _ in range(poller_mod.MAX_SHRED_ATTEMPTS):
        await poller.cycle()
        updates += drain(reg)
    assert [u.logs_drained for u in updates][-1] is True  # gave up (logged), so the task is not held forever
    assert other.exists()
