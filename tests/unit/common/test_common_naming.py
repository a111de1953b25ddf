"""Deterministic job names per task-instance try."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa_airflow.common.naming import (
    JOB_NAME_RE,
    earlier_try_names,
    job_name_for,
    task_instance_hash,
    validate_job_name,
)
from npa_airflow.exceptions import NpaValidationError


def test_name_shape():
    name = job_name_for("train_dag", "fit.model", "manual__2026-12-02T13:00:00+00:00", None, 2)
    digest = task_instance_hash("train_dag", "fit.model", "manual__2026-12-02T13:00:00+00:00", None)
    assert name == f"npa-train-dag-fit-model-{digest}-t2"
    assert len(digest) == 10


def test_name_is_stable_across_processes():
    code = "from npa_airflow.common.naming import job_name_for; print(job_name_for('d', 't', 'r', 3, 1))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == job_name_for("d", "t", "r", 3, 1)


def test_identity_parts_change_the_hash_but_try_does_not():
    base = job_name_for("d", "t", "r", None, 1)
    assert job_name_for("d", "t", "r", 0, 1) != base  # map index 0 differs from unmapped
    assert job_name_for("d", "t", "r2", None, 1) != base
    assert job_name_for("d", "t2", "r", None, 1) != base
    assert job_name_for("d", "t", "r", None, 5).rsplit("-", 1)[0] == base.rsplit("-", 1)[0]
    # slugs can collide; the hash keeps the names apart
    assert job_name_for("a_b", "c", "r", None, 1) != job_name_for("a", "b_c", "r", None, 1)


def test_earlier_try_names():
    assert earlier_try_names("d", "t", "r", 1, 1) == []
    names = earlier_try_names("d", "t", "r", 1, 4)
    assert names == [job_name_for("d", "t", "r", 1, n) for n in (1, 2, 3)]
    assert [n.rsplit("-", 1)[1] for n in names] == ["t1", "t2", "t3"]


@given(
    dag=st.text(min_size=1, max_size=250),
    task=st.text(min_size=1, max_size=250),
    run=st.text(min_size=1, max_size=250),
    index=st.one_of(st.none(), st.integers(min_value=-1, max_value=10**6)),
    try_number=st.integers(min_value=1, max_value=10**4),
)
def test_any_identity_gives_a_safe_bounded_name(dag, task, run, index, try_number):
    name = job_name_for(dag, task, run, index, try_number)
    assert JOB_NAME_RE.fullmatch(name)
    assert len(name) <= 4 + 40 + 1 + 10 + 2 + 5


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("", "t", "r", None, 1), "dag_id"),
        (("d", "t", "r", None, 0), "try_number"),
        (("d", "t", "r", None, True), "try_number"),
    ],
)
def test_bad_arguments(args, field):
    with pytest.raises(NpaValidationError, match=field):
        job_name_for(*args)


@pytest.mark.parametrize("name", ["", "a b", "a,b", "-x", "a|b", "x" * 129, "a\n", "$(x)", "a;b"])
def test_validate_job_name_rejects(name):
    with pytest.raises(NpaValidationError, match="job_name"):
        validate_job_name(name)
