"""checkpoint_signal: the accepted forms and the time checks."""

from __future__ import annotations

import re

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import SlurmSubmitOperator
from npa_airflow.slurm.submit.spec import SbatchSpec
from npa_airflow.slurm.submit.spec_fields import CheckpointSignal

BASE = {"job_name": "npa-train-0123456789-t1", "command": "python train.py", "log_dir": "/l", "results_dir": "/r"}
FORM = re.escape("write '<SIGNAL>@<seconds>': SIGNAL one of USR1, USR2, TERM, INT, HUP") + ".*e.g. 'USR1@300'"


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
    with pytest.raises(NpaValidationError, match=r"'--signal=B:USR1@300': use checkpoint_signal \(e.g. 'USR1@300'\)"):
        spec(extra_sbatch=("--signal=B:USR1@300",))
