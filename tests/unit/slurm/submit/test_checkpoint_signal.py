"""checkpoint_signal: the accepted forms, the time checks, the rendered script, and real-bash runs of the task under
the ways Slurm delivers `--signal` (ProctrackType), with local doubles for srun and scontrol (no Slurm here; the
integration test tests/integration/test_slurm_checkpoint_signal.py runs it on the real cluster)."""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import SlurmSubmitOperator
from npa_airflow.slurm.submit.scripts import (
    bash_syntax_check,
    container_arguments,
    lint_script,
    render_sbatch,
    sbatch_directives,
)
from npa_airflow.slurm.submit.spec import SbatchSpec
from npa_airflow.slurm.submit.spec_fields import CheckpointSignal
from tests.unit.slurm.submit.test_slurm_scripts import PYXIS_SRUN_DOUBLE, make, run_script, trace

BASE = {"job_name": "npa-train-0123456789-t1", "command": "python train.py", "log_dir": "/l", "results_dir": "/r"}
FORM = re.escape("write '<SIGNAL>@<seconds>': SIGNAL one of USR1, USR2, TERM, INT, HUP") + ".*e.g. 'USR1@900'"


def spec(**overrides) -> SbatchSpec:
    return SbatchSpec(**{**BASE, **overrides})


# --------------------------------------------------------------------------------------------- forms


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("USR1@900", "USR1@900"),
        ("usr1@900", "USR1@900"),
        ("SIGUSR2@900", "USR2@900"),
        ("sigterm@800", "TERM@800"),
        ("Int@721", "INT@721"),
        ("HUP@14399", "HUP@14399"),
    ],
)
def test_accepted_forms_are_normalised(given, normalised):
    s = spec(checkpoint_signal=given)
    assert s.checkpoint_signal == normalised
    name, seconds = normalised.split("@")
    assert s.checkpoint == CheckpointSignal(name, int(seconds)) and str(s.checkpoint) == normalised
    assert spec().checkpoint_signal is None and spec().checkpoint is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("USR1", FORM),
        ("USR1@", FORM),
        ("@900", FORM),
        ("USR1@-5", FORM),
        ("USR1@9.5", FORM),
        (" USR1@900", FORM),
        ("10@900", "10 is not a signal to checkpoint on; " + FORM),
        ("KILL@900", "KILL is not a signal to checkpoint on; " + FORM),
        ("SIGSTOP@900", "STOP is not a signal to checkpoint on; " + FORM),
        ("B:USR1@900", re.escape("no B: or R: prefix (the signal is for the command, not the batch shell); ") + FORM),
        ("USR1@0", "0 s is outside Slurm's range; " + FORM),
        ("USR1@65536", "65536 s is outside Slurm's range; " + FORM),
        (900, FORM),
    ],
)
def test_refused_forms_say_the_accepted_form_with_an_example(given, message):
    with pytest.raises(NpaValidationError, match=re.escape(f"SbatchSpec.checkpoint_signal={given!r}: ") + message):
        spec(checkpoint_signal=given)


def test_the_warning_must_come_after_the_start_of_the_time_limit_slurm_is_given():
    """Slurm's limit is whole minutes (ceil(time_hours * 60)): 2/60 h is 120 s."""
    assert spec(time_hours=2 / 60, checkpoint_signal="USR1@60").checkpoint == CheckpointSignal("USR1", 60)
    with pytest.raises(NpaValidationError, match=r"the time limit is 120 s after the start \(time_hours=0\.0333"):
        spec(time_hours=2 / 60, checkpoint_signal="USR1@120")
    assert spec(time_hours=1, timeout_hours=0.999, checkpoint_signal="USR1@3599").checkpoint.seconds == 3599
    with pytest.raises(NpaValidationError, match="a warning 3600 s before it would come before the job runs"):
        spec(time_hours=1, timeout_hours=0.999, checkpoint_signal="USR1@3600")


def test_the_warning_must_come_before_the_child_timeout_stops_the_command():
    """4 h with the default child timeout (95 %): the command is stopped 720 s before the limit."""
    with pytest.raises(NpaValidationError) as err:
        spec(checkpoint_signal="USR1@300")
    message = str(err.value)
    assert "the command is stopped at its child timeout, 720 s before the time limit (timeout_hours=3.8" in message
    assert "ask for more than 720 s (e.g. 'USR1@780'), or set timeout_hours closer to time_hours" in message
    with pytest.raises(NpaValidationError, match="720 s before the time limit"):
        spec(checkpoint_signal="USR1@720")
    assert spec(checkpoint_signal="USR1@721").checkpoint_signal == "USR1@721"
    assert spec(timeout_hours=3.95, checkpoint_signal="USR1@300").checkpoint_signal == "USR1@300"  # 180 s lead


def test_the_operator_checks_it_at_dag_parse_time_and_does_not_template_it():
    with pytest.raises(NpaValidationError, match="SbatchSpec.checkpoint_signal='USR1': " + FORM):
        SlurmSubmitOperator(task_id="t", command="x", checkpoint_signal="USR1")
    with pytest.raises(NpaValidationError, match="child timeout, 720 s before"):
        SlurmSubmitOperator(task_id="t", command="x", checkpoint_signal="USR1@300")
    with pytest.raises(NpaValidationError, match="time limit is 120 s after the start"):
        SlurmSubmitOperator(task_id="t", command="x", time_hours=2 / 60, checkpoint_signal="USR1@120")
    op = SlurmSubmitOperator(task_id="t", command="x", time_hours=2 / 60, checkpoint_signal="sigusr1@60")
    assert op.checkpoint_signal == "sigusr1@60" and "checkpoint_signal" not in op.template_fields


def test_the_names_and_the_sbatch_option_are_the_templates_own():
    with pytest.raises(NpaValidationError, match="is set by the sbatch template itself"):
        spec(environment={"NPA_CHECKPOINT_SIGNAL": "USR1"})
    with pytest.raises(NpaValidationError, match="is set by the sbatch template itself"):
        spec(environment={"NPA_CHECKPOINT_SECONDS": "300"})
    with pytest.raises(NpaValidationError, match=r"'--signal=B:USR1@300': use checkpoint_signal \(e.g. 'USR1@900'\)"):
        spec(extra_sbatch=("--signal=B:USR1@300",))


# --------------------------------------------------------------------------------------------- the script


def test_the_sbatch_line_has_no_b_prefix_and_the_step_gets_both_names():
    script = render_sbatch(spec(checkpoint_signal="sigusr1@900"))
    assert "#SBATCH --signal=USR1@900\n" in script and "B:" not in script
    assert "--signal=USR1@900" in sbatch_directives(spec(checkpoint_signal="USR1@900"))
    assert "export NPA_CHECKPOINT_SIGNAL=USR1\nexport NPA_CHECKPOINT_SECONDS=900\n" in script
    assert "  npa_run\n" in script and "timeout --signal=TERM" not in script
    unset = render_sbatch(spec())
    assert not any(s in unset for s in ("#SBATCH --signal", "NPA_CHECKPOINT", "  npa_run\n", "npa_pass_on"))


def test_the_container_keeps_both_names_and_every_name_exported_before_srun():
    s = spec(nodes=2, image="/i.sqsh", environment={"A_VAR": "1"}, checkpoint_signal="USR2@900")
    assert container_arguments(s)[-1] == (
        "--container-env=NPA_RESULTS_DIR,NPA_CHILD_EXIT_CODE_FILE,NPA_CHILD_TIMEOUT_SECONDS,"
        "NPA_CHECKPOINT_SIGNAL,NPA_CHECKPOINT_SECONDS,MASTER_ADDR,A_VAR"
    )
    script = render_sbatch(s)
    exported = {m.group(1) for m in re.finditer(r"^export ([A-Za-z_][A-Za-z0-9_]*)=", script, re.M)}
    assert exported == set(re.search(r"--container-env=(\S+)", script).group(1).split(","))
    assert "NPA_CHECKPOINT" not in container_arguments(spec(image="/i.sqsh"))[-1]


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("image", [None, "/i.sqsh"])
def test_every_checkpoint_render_is_lint_clean_and_valid_bash(nodes, image):
    s = spec(nodes=nodes, image=image, env_file="/r/.env", checkpoint_signal="INT@900", pre_commands=("echo pre",))
    script = render_sbatch(s)
    assert lint_script(script) == []
    bash_syntax_check(script)


# --------------------------------------------------------------------------------------------- real bash

PROCTRACK_SRUN = r"""#!/bin/bash
# Test double for srun when Slurm sends --signal (no Slurm here): starts each task as slurmstepd does, waits until
# every task's command says it is ready ($NPA_TEST_DIR/ready-<rank>), then sends $NPA_TEST_SIGNAL the way
# ProctrackType $NPA_TEST_PROCTRACK does: cgroup, to the tasks only; pgid, to each task's process group;
# linuxproc, to every process under the tasks. Returns the highest rc of the tasks.
n=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in --ntasks=*) n=${1#--ntasks=} ;; esac
  shift
done
set -m
tasks=()
for ((i = 0; i < n; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME=c$((i + 1)) "$@" &
  tasks+=($!)
done
set +m
for ((t = 0; t < 200; t++)); do
  ready=0
  for ((i = 0; i < n; i++)); do [ -e "$NPA_TEST_DIR/ready-$i" ] && ready=$((ready + 1)); done
  ((ready == n)) && break
  sleep 0.05
done
under() {
  local p
  for p in $(ps -e -o pid=,ppid= | awk -v pp="$1" '$2 == pp {print $1}'); do echo "$p"; under "$p"; done
}
for task in "${tasks[@]}"; do
  case $NPA_TEST_PROCTRACK in
    cgroup) kill -s "$NPA_TEST_SIGNAL" "$task" ;;
    pgid) kill -s "$NPA_TEST_SIGNAL" -- "-$task" ;;
    linuxproc) kill -s "$NPA_TEST_SIGNAL" $task $(under "$task") 2>/dev/null ;;
  esac
done
rc=0
for task in "${tasks[@]}"; do wait "$task" || { r=$?; ((r > rc)) && rc=$r; }; done
exit $rc
"""
# The training command: a child to wait for, a trap that "checkpoints" and exits 0, then ready.
TRAPPING = (
    "sleep 30 & child=$!\n"
    'trap \'echo "rank $SLURM_PROCID got $NPA_CHECKPOINT_SIGNAL, $NPA_CHECKPOINT_SECONDS s before the limit"; '
    "kill $child 2>/dev/null || :; exit 0' {signal}\n"
    'touch "$NPA_TEST_DIR/ready-$SLURM_PROCID"\n'
    "wait"
)
# A worker in a session of its own, as torchrun starts its workers: a process group would miss it.
SESSION_WORKER = """
import os, signal, sys, time
os.setsid()
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
open(os.path.join(os.environ["NPA_TEST_DIR"], "ready-" + os.environ["SLURM_PROCID"]), "w").close()
for _ in range(300):
    if got:
        print("worker of rank", os.environ["SLURM_PROCID"], "got USR1", flush=True)
        sys.exit(0)
    time.sleep(0.1)
sys.exit(7)
"""


def leftover_sleeps(seconds: int, settle: float = 5.0) -> list[str]:
    """Processes still running `sleep <seconds>` (the watchdog's, at the child timeout) once the SIGKILL the script
    sent them has had `settle` seconds to land (a loaded machine delivers it late)."""
    deadline = time.monotonic() + settle
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if cmdline.read_bytes() == f"sleep\0{seconds}\0".encode():
                    found.append(cmdline.parent.name)
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def signalled(tmp_path: Path, command: str, proctrack: str, signal: str = "USR1", **overrides):
    spec = make(tmp_path, command, time_hours=0.1, checkpoint_signal=f"{signal}@60", **overrides)  # timeout 342 s
    env = {"NPA_TEST_PROCTRACK": proctrack, "NPA_TEST_SIGNAL": signal}
    return run_script(tmp_path, spec, PROCTRACK_SRUN, **env)


@pytest.mark.parametrize("proctrack", ["cgroup", "pgid", "linuxproc"])
def test_every_task_passes_the_signal_on_and_the_job_ends_as_a_success(tmp_path, proctrack):
    proc, results = signalled(tmp_path, TRAPPING.format(signal="USR1"), proctrack, nodes=2, gpus_per_node=0)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert f"rank {rank} got USR1, 60 s before the limit" in proc.stdout
    assert proc.stderr.count("npa: SIGUSR1 passed on to the command") == 2
    assert sorted(trace(tmp_path)) == ["leader-0", "post-0", "post-1", "pre-0", "pre-1"]
    assert (results / "child_exit_code").read_text() == "0\n" and (results / "status.json").exists()
    assert leftover_sleeps(342) == []


@pytest.mark.parametrize("signal", ["USR2", "TERM", "INT", "HUP"])
def test_each_accepted_signal_reaches_the_command(tmp_path, signal):
    proc, _ = signalled(tmp_path, TRAPPING.format(signal=signal), "pgid", signal)  # the task's group, not the command's
    assert proc.returncode == 0, proc.stderr
    assert f"rank 0 got {signal}, 60 s before the limit" in proc.stdout


def test_a_worker_in_a_session_of_its_own_is_reached_and_the_commands_shell_outlives_the_signal(tmp_path):
    """A Python program run by the command's shell, in a session of its own as torchrun's workers are: its handler
    catches the signal, and the shell, which traps nothing itself, waits for it instead of dying of the signal."""
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(SESSION_WORKER)}"
    proc, _ = signalled(tmp_path, command, "pgid")
    assert proc.returncode == 0, proc.stderr
    assert "worker of rank 0 got USR1" in proc.stdout


def test_a_command_that_does_not_trap_it_fails_with_the_signal(tmp_path):
    proc, results = signalled(tmp_path, 'touch "$NPA_TEST_DIR/ready-0"; sleep 30', "cgroup")
    assert proc.returncode == 128 + 10  # SIGUSR1: the command died of it; the task did not
    assert (results / "child_exit_code").read_text() == "138\n" and not (results / "status.json").exists()
    assert trace(tmp_path) == ["pre-0"]


def test_the_child_timeout_still_stops_the_command_with_timeouts_code(tmp_path):
    """The watchdog does what timeout(1) does without the signal: SIGTERM at the child timeout, exit 124 even when
    the command then exits 0."""
    command = "trap 'echo stopped; exit 0' TERM\nsleep 30 & wait"
    spec = make(tmp_path, command, time_hours=0.01, timeout_hours=0.0006, checkpoint_signal="USR1@59")  # 2 s
    proc, results = run_script(tmp_path, spec)
    assert proc.returncode == 124 and "stopped" in proc.stdout
    assert (results / "child_exit_code").read_text() == "124\n" and not (results / "status.json").exists()


def test_without_a_signal_the_command_runs_to_its_end(tmp_path):
    proc, results = run_script(tmp_path, make(tmp_path, "echo done; exit 3", checkpoint_signal="USR1@900"))
    assert proc.returncode == 3 and "done" in proc.stdout and "npa:" not in proc.stderr
    proc, results = run_script(tmp_path, make(tmp_path, "echo done", checkpoint_signal="USR1@900"))
    assert proc.returncode == 0 and (results / "status.json").exists()


def test_the_names_reach_the_command_in_an_image_that_sets_them_too(tmp_path):
    seen = tmp_path / "seen"
    command = f'echo "$NPA_CHECKPOINT_SIGNAL $NPA_CHECKPOINT_SECONDS" > {seen}'
    spec = make(tmp_path, command, image="/sqsh/x.sqsh", checkpoint_signal="HUP@900")
    image_env = "NPA_CHECKPOINT_SIGNAL=image NPA_CHECKPOINT_SECONDS=image"
    proc, _ = run_script(tmp_path, spec, PYXIS_SRUN_DOUBLE, NPA_TEST_IMAGE_ENV=image_env)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == "HUP 900\n"


def test_the_example_a_refusal_gives_is_accepted_with_the_default_time_limit():
    """The advice works: the form's example comes after the default child timeout's cut-off, not before it."""
    from npa_airflow.slurm.operators import SlurmSubmitOperator

    with pytest.raises(NpaValidationError) as err:
        SlurmSubmitOperator(task_id="t", command="x", checkpoint_signal="USR1")
    example = re.search(r"e\.g\. '([^']+)'", str(err.value)).group(1)
    assert SlurmSubmitOperator(task_id="t", command="x", checkpoint_signal=example).checkpoint_signal == example
