"""The rename helper (common/renamed.py) and the duration check both backends' max_wait share (common/checks.py)."""

from __future__ import annotations

import warnings
from datetime import timedelta

import pytest

from npa_airflow.common.checks import positive_duration
from npa_airflow.common.renamed import BURST_RENAMED, renamed, require
from npa_airflow.exceptions import NpaValidationError


def _dag_line(new_value, old_value, default_args=None):
    """Stand-in for an operator's __init__ called from a DAG file (this file)."""
    return renamed("Op(task_id='t')", "command", new_value, "entrypoint", old_value, default_args)


def test_the_new_name_alone_is_taken_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _dag_line("python t.py", None) == "python t.py"
        assert _dag_line(None, None) is None


def test_the_old_name_works_and_warns_at_the_line_that_called_the_operator():
    with pytest.warns(DeprecationWarning, match=r"Op\(task_id='t'\): entrypoint= is deprecated, use command=") as w:
        assert _dag_line(None, "python t.py") == "python t.py"
    assert w[0].filename == __file__  # not renamed.py: the frame of the caller outside npa_airflow


def test_both_names_are_an_error_naming_the_new_one():
    with pytest.raises(NpaValidationError, match=r"both command= and entrypoint= given.*pass only command="):
        _dag_line("a", "b")


def test_a_name_the_task_passes_wins_over_default_args():
    # default_args gave the new name, the task the old one: the task's value (with the warning).
    defaults = {"command": "from defaults"}
    with pytest.warns(DeprecationWarning):
        assert _dag_line(defaults["command"], "explicit", defaults) == "explicit"
    # default_args gave the old name, the task the new one: the new one, silently.
    defaults = {"entrypoint": "from defaults"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _dag_line("explicit", defaults["entrypoint"], defaults) == "explicit"


def test_both_from_default_args_keep_the_old_name_this_operator_read_before():
    defaults = {"command": "for slurm", "entrypoint": "for burst"}
    with pytest.warns(DeprecationWarning):
        assert _dag_line(defaults["command"], defaults["entrypoint"], defaults) == "for burst"


def test_require_names_the_missing_argument():
    assert require("Op", "command", "x") == "x"
    with pytest.raises(TypeError, match="Op: missing keyword argument 'command'"):
        require("Op", "command", None)


def test_the_renamed_table_is_old_to_new_and_keeps_gpus_per_node_apart():
    assert BURST_RENAMED["deadline"] == "max_wait" and BURST_RENAMED["gpu_per_node"] == "accelerators"
    assert "gpus_per_node" not in BURST_RENAMED.values()  # a count (Slurm) is not an accelerator spec (Burst)


def test_positive_duration_takes_a_timedelta_or_seconds():
    assert positive_duration(None, "max_wait") is None
    assert positive_duration(90, "max_wait") == timedelta(seconds=90)
    assert positive_duration(timedelta(minutes=2), "max_wait") == timedelta(minutes=2)
    for bad in (0, -1, True, "60", float("nan"), float("inf"), timedelta(0)):
        with pytest.raises(NpaValidationError, match=r"max_wait=.*positive"):
            positive_duration(bad, "max_wait")
