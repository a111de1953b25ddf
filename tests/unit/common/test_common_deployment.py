"""The deployment identity: where it comes from, and the owner proof it gives a job."""

from __future__ import annotations

import json
import uuid

import pytest

from npa_airflow.common import deployment as d
from npa_airflow.common.deployment import Deployment, NpaNoDeploymentIdentity, current_deployment
from npa_airflow.exceptions import NpaValidationError

PROD = Deployment("prod-key-0123456789abcdef", 100.0, "test")
STAGING = Deployment("staging-key-0123456789abcd", 100.0, "test")
NAME = "npa-train-daily-train-0123456789-t1"


@pytest.fixture
def fresh_identity(monkeypatch):
    current_deployment.cache_clear()
    yield monkeypatch
    current_deployment.cache_clear()


def test_the_owner_proof_is_this_deployment_s_for_this_name():
    ti = uuid.uuid4()
    comment = PROD.owner_comment(NAME, ti)
    assert comment.startswith(f"npa1:{ti}:")
    assert PROD.owns(NAME, comment)
    assert not STAGING.owns(NAME, comment)  # another deployment's job with the same name
    assert not PROD.owns(NAME.replace("-t1", "-t2"), comment)  # a proof is for one name only
    assert not PROD.owns(NAME, comment.replace(str(ti), str(uuid.uuid4())))  # nor for another task instance
    assert not PROD.owns(NAME, comment[:-1] + ("0" if comment[-1] != "0" else "1"))
    for other in (None, "", "npa1", "npa1:-:", f"{comment} ", "x" + comment):
        assert PROD.owns(NAME, other) is (other == f"{comment} ")  # surrounding blanks aside, exact
    assert PROD.owns(NAME, PROD.owner_comment(NAME, None))  # a task instance without an id


def test_the_tag_names_the_deployment_without_revealing_the_key():
    assert PROD.tag != STAGING.tag
    assert len(PROD.tag) == 8
    assert PROD.key not in repr(PROD)


@pytest.mark.parametrize("key", ["short", "has a space in it 123", "x" * 257, "tab\tinside-0123456789"])
def test_a_key_that_is_too_weak_or_unsafe_is_refused(key):
    with pytest.raises(NpaValidationError, match="deployment identity"):
        Deployment(key, None, "config")


def test_configuration_overrides_the_metadata_database(fresh_identity):
    fresh_identity.setenv("AIRFLOW__NPA_AIRFLOW__DEPLOYMENT_ID", "shared-on-purpose-0123456789")
    found = current_deployment()
    assert found.key == "shared-on-purpose-0123456789"
    assert found.created_at is None  # no upgrade window: names of earlier releases are not looked for


def test_the_identity_is_read_from_its_connection(fresh_identity):
    fresh_identity.delenv("AIRFLOW__NPA_AIRFLOW__DEPLOYMENT_ID", raising=False)
    fresh_identity.setenv(
        "AIRFLOW_CONN_NPA_AIRFLOW_DEPLOYMENT",
        json.dumps({"conn_type": "generic", "password": "from-the-connection-0123", "extra": {"created_at": 42.5}}),
    )
    found = current_deployment()
    assert (found.key, found.created_at, found.source) == (
        "from-the-connection-0123",
        42.5,
        "connection npa_airflow_deployment",
    )


def test_a_process_that_cannot_create_the_identity_says_what_to_do(fresh_identity):
    fresh_identity.delenv("AIRFLOW__NPA_AIRFLOW__DEPLOYMENT_ID", raising=False)
    fresh_identity.delenv("AIRFLOW_CONN_NPA_AIRFLOW_DEPLOYMENT", raising=False)

    def no_database():
        raise RuntimeError("Direct database access via the ORM is not allowed")

    fresh_identity.setattr(d, "ensure_identity", no_database)
    with pytest.raises(NpaNoDeploymentIdentity, match=r"scheduler.*starts.*deployment_id"):
        current_deployment()
