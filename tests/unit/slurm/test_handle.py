"""SlurmJobHandle: JSON round trip and validation of what comes back from XCom or a trigger row."""

from __future__ import annotations

import json

import pytest

from npa_airflow.common import xcom_keys
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.handle import SlurmJobHandle

GOOD = {
    "conn_id": "slurm_default",
    "cluster": None,
    "job_id": "123",
    "job_name": "npa-train-fit-0123456789-t1",
    "login_host": "login1.example.org",
    "results_dir": "/lustre/results/run 1",
    "stdout_path": "/lustre/logs/npa-train-fit-0123456789-t1/main.out",
    "stderr_path": "/lustre/logs/npa-train-fit-0123456789-t1/main.err",
    "try_number": 1,
    "retry_of": None,
    "submitted_at": 1796216400.25,
    "script_path": "/lustre/results/sbatch/npa-train-fit-0123456789-t1.sbatch",
}


def test_round_trip_through_json():
    handle = SlurmJobHandle.from_dict(GOOD)
    data = json.loads(json.dumps(handle.to_dict()))
    assert data == GOOD
    assert SlurmJobHandle.from_dict(data) == handle
    assert xcom_keys.SLURM_JOB == "slurm_job"


def test_optional_fields_default():
    data = {k: v for k, v in GOOD.items() if k not in ("retry_of", "submitted_at", "script_path")}
    handle = SlurmJobHandle.from_dict(data)  # a handle written before script_path existed still reads
    assert (handle.retry_of, handle.submitted_at, handle.script_path) == (None, None, None)


def test_frozen():
    handle = SlurmJobHandle.from_dict(GOOD)
    with pytest.raises(AttributeError):
        handle.job_id = "9"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("job_id", "123; scancel -u me"),
        ("job_id", 123),
        ("cluster", "bad cluster"),
        ("job_name", "a b"),
        ("login_host", "host; rm"),
        ("results_dir", "relative/dir"),
        ("stdout_path", "/a\nb"),
        ("try_number", 0),
        ("try_number", "1"),
        ("retry_of", "x"),
        ("submitted_at", "yesterday"),
        ("submitted_at", float("nan")),
        ("conn_id", ""),
    ],
)
def test_bad_field_is_named(key, value):
    with pytest.raises(NpaValidationError, match=key):
        SlurmJobHandle.from_dict({**GOOD, key: value})


def test_from_dict_rejects_unknown_missing_and_non_dict():
    with pytest.raises(NpaValidationError, match="unknown keys"):
        SlurmJobHandle.from_dict({**GOOD, "extra": 1})
    with pytest.raises(NpaValidationError, match="missing"):
        SlurmJobHandle.from_dict({k: v for k, v in GOOD.items() if k != "job_id"})
    with pytest.raises(NpaValidationError, match="must be a dict"):
        SlurmJobHandle.from_dict(["123"])


def test_multi_cluster_and_retry():
    handle = SlurmJobHandle.from_dict({**GOOD, "cluster": "west", "job_id": "124", "retry_of": "123", "try_number": 2})
    assert (handle.cluster, handle.retry_of) == ("west", "123")
