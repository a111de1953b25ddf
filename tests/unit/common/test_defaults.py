"""default_deferrable: deferrable unless the environment explicitly turns the site default off."""

from __future__ import annotations

import pytest

from npa_airflow.common.defaults import default_deferrable
from npa_airflow.slurm.operators import SlurmSubmitOperator
from tests.harness.slurm_operator_doubles import install_unit_connection


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    install_unit_connection(monkeypatch)


def test_default_deferrable(monkeypatch):
    monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    assert default_deferrable() is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "false")
    assert default_deferrable() is False
    assert SlurmSubmitOperator(task_id="t", command="x").deferrable is False
    assert SlurmSubmitOperator(task_id="t", command="x", deferrable=True).deferrable is True


@pytest.mark.parametrize("raw", ["1", "true", "True", " TRUE ", "t", "yes", "y", "on"])
def test_true_spellings_keep_deferrable(monkeypatch, raw):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raw)
    assert default_deferrable() is True


@pytest.mark.parametrize("raw", ["0", "false", "no", "off", "", "maybe"])
def test_anything_else_set_explicitly_turns_it_off(monkeypatch, raw):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raw)
    assert default_deferrable() is False
