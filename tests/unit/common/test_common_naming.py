"""Deterministic job names per task-instance try, keyed by the deployment."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa_airflow.common.deployment import Deployment
from npa_airflow.common.naming import (
    JOB_NAME_RE,
    earlier_try_names,
    job_name_for,
    legacy_earlier_try_names,
    legacy_job_name_for,
    task_instance_hash,
    validate_job_name,
)
from npa_airflow.exceptions import NpaValidationError

PROD = Deployment("prod-key-0123456789abcdef", 1.0, "test")
STAGING = Deployment("staging-key-0123456789abcd", 1.0, "test")


def name(*args, deployment=PROD):
    return job_name_for(*args, deployment=deployment)


def test_name_shape():
    got = name("train_dag", "fit.model", "manual__2026-12-02T13:00:00+00:00", None, 2)
    digest = task_instance_hash("train_dag", "fit.model", "manual__2026-12-02T13:00:00+00:00", None, deployment=PROD)
    assert got == f"npa-train-dag-fit-model-{digest}-t2"
    assert len(digest) == 10


def test_two_deployments_never_derive_the_same_name_for_the_same_task_instance():
    """A scheduled run has the same run id in every deployment: the deployment's key keeps the names apart."""
    args = ("train_daily", "train", "scheduled__2026-12-04T00:00:00+00:00", None, 1)
    assert name(*args) != name(*args, deployment=STAGING)
    assert name(*args).rsplit("-", 2)[0] == name(*args, deployment=STAGING).rsplit("-", 2)[0]  # same readable slug
    # a deployment that shares its key on purpose (a configured deployment_id) derives the same names
    assert name(*args) == name(*args, deployment=Deployment(PROD.key, None, "config"))


def test_name_is_stable_across_processes():
    code = (
        "from npa_airflow.common.deployment import Deployment; from npa_airflow.common.naming import job_name_for; "
        "print(job_name_for('d', 't', 'r', 3, 1, deployment=Deployment('prod-key-0123456789abcdef', None, 'x')))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == name("d", "t", "r", 3, 1)


def test_identity_parts_change_the_hash_but_try_does_not():
    base = name("d", "t", "r", None, 1)
    assert name("d", "t", "r", 0, 1) != base  # map index 0 differs from unmapped
    assert name("d", "t", "r2", None, 1) != base
    assert name("d", "t2", "r", None, 1) != base
    assert name("d", "t", "r", None, 5).rsplit("-", 1)[0] == base.rsplit("-", 1)[0]
    # slugs can collide; the hash keeps the names apart
    assert name("a_b", "c", "r", None, 1) != name("a", "b_c", "r", None, 1)


def test_earlier_try_names():
    assert earlier_try_names("d", "t", "r", 1, 1, deployment=PROD) == []
    names = earlier_try_names("d", "t", "r", 1, 4, deployment=PROD)
    assert names == [name("d", "t", "r", 1, n) for n in (1, 2, 3)]
    assert [n.rsplit("-", 1)[1] for n in names] == ["t1", "t2", "t3"]


def test_legacy_names_are_the_previous_release_s():
    """The previous release hashed the identity alone (sha256 of the JSON list): kept byte for byte, so a try after
    the upgrade finds the job an earlier try submitted under it."""
    assert legacy_job_name_for("train_dag", "fit.model", "manual__2026-12-02T13:00:00+00:00", None, 2) == (
        "npa-train-dag-fit-model-c13d1e3792-t2"
    )
    assert legacy_earlier_try_names("d", "t", "r", None, 3) == [
        legacy_job_name_for("d", "t", "r", None, n) for n in (1, 2)
    ]
    assert legacy_job_name_for("d", "t", "r", None, 1) not in (name("d", "t", "r", None, 1),)


@given(
    dag=st.text(min_size=1, max_size=250),
    task=st.text(min_size=1, max_size=250),
    run=st.text(min_size=1, max_size=250),
    index=st.one_of(st.none(), st.integers(min_value=-1, max_value=10**6)),
    try_number=st.integers(min_value=1, max_value=10**4),
)
def test_any_identity_gives_a_safe_bounded_name(dag, task, run, index, try_number):
    for got in (name(dag, task, run, index, try_number), legacy_job_name_for(dag, task, run, index, try_number)):
        assert JOB_NAME_RE.fullmatch(got)
        assert len(got) <= 4 + 40 + 1 + 10 + 2 + 5


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
        name(*args)
    with pytest.raises(NpaValidationError, match=field):
        legacy_job_name_for(*args)


@pytest.mark.parametrize("bad", ["", "a b", "a,b", "-x", "a|b", "x" * 129, "a\n", "$(x)", "a;b"])
def test_validate_job_name_rejects(bad):
    with pytest.raises(NpaValidationError, match="job_name"):
        validate_job_name(bad)
