"""Which jobs found by a task instance's names are its own (npa_airflow.slurm.submit.job_owners)."""

from __future__ import annotations

import uuid

import pytest

from npa_airflow.common.deployment import Deployment
from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.submit.job_owners import TryNames, describe_foreign, sort_by_owner

PROD = Deployment("prod-key-0123456789abcdef", 100.0, "test")
STAGING = Deployment("staging-key-0123456789abcd", 100.0, "test")
NAMES = TryNames("npa-t-0000000002-t3", ("npa-t-0000000002-t1", "npa-t-0000000002-t2"), ("npa-t-1111111111-t1",))


def info(name, state=JobState.RUNNING, source="squeue", comment=None, submitted_at=None, job_id="7"):
    return SlurmJobInfo(job_id, state.value, state, None, None, name, None, None, source, comment, submitted_at)


def owned(found, deployment=PROD):
    return sort_by_owner(found, NAMES, deployment)


def test_try_names_know_each_name_s_try():
    assert NAMES.all == ["npa-t-0000000002-t1", "npa-t-0000000002-t2", "npa-t-0000000002-t3", "npa-t-1111111111-t1"]
    assert [NAMES.try_of(n) for n in NAMES.all] == [1, 2, 3, 1]


@pytest.mark.parametrize("name", [NAMES.own, *NAMES.earlier])
def test_a_job_with_this_deployment_s_proof_is_owned_and_one_without_is_foreign(name):
    proof = PROD.owner_comment(name, uuid.uuid4())
    assert owned([info(name, comment=proof)]).owned
    assert owned([info(name, comment=proof)], STAGING).foreign  # same name, another deployment's key
    assert owned([info(name, comment=PROD.owner_comment("npa-other-t1", None))]).foreign  # another name's proof
    assert owned([info(name, comment=None)]).foreign  # squeue always shows the comment: none means not ours
    assert owned([info(name, state=JobState.PENDING, source="sacct")]).foreign  # a live job needs its proof


def test_an_ended_job_only_accounting_reports_needs_no_comment():
    """Without AccountingStoreFlags=job_comment sacct has no comments: an ended job is only read, so it counts."""
    for state in (JobState.COMPLETE, JobState.ERROR, JobState.CANCELED):
        assert owned([info(NAMES.earlier[0], state=state, source="sacct")]).owned
    assert owned([info(NAMES.earlier[0], JobState.COMPLETE, "sacct", comment="made by hand")]).foreign


@pytest.mark.parametrize(
    ("submitted_at", "comment", "is_owned"),
    [(99.0, None, True), (100.0, None, False), (None, None, False), (50.0, "npa1:-:0123456789abcdef01234567", False)],
)
def test_a_previous_release_s_job_is_owned_only_when_submitted_before_the_upgrade(submitted_at, comment, is_owned):
    found = [info(NAMES.legacy[0], comment=comment, submitted_at=submitted_at)]
    assert bool(owned(found).owned) is is_owned
    configured = Deployment(PROD.key, None, "config")  # a configured identity has no upgrade time
    assert owned(found, configured).foreign


def test_a_name_of_no_try_is_never_owned():
    assert owned([info("npa-t-9999999999-t1", comment=PROD.owner_comment("npa-t-9999999999-t1", None))]).foreign


def test_the_report_of_a_foreign_job_names_it_and_its_comment():
    assert describe_foreign(info(NAMES.own, comment="x|y", job_id="41")) == (
        "Slurm job 41 (npa-t-0000000002-t3, RUNNING, comment 'x|y')"
    )
    assert describe_foreign(info(NAMES.own, job_id="41")).endswith("no owner proof)")


def test_a_previous_release_s_job_from_the_second_of_the_upgrade_is_not_taken():
    """Slurm records submit times in whole seconds: a job of second 100 may come after an upgrade at 100.4."""
    upgraded = Deployment(PROD.key, 100.4, "test")
    assert owned([info(NAMES.legacy[0], submitted_at=100.0)], upgraded).foreign
    assert owned([info(NAMES.legacy[0], submitted_at=99.0)], upgraded).owned
