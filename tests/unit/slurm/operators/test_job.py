"""PreparedJob.from_spec, results_root_for and handle_for: building a job and its handle without I/O."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.operators import job as job_module
from npa_airflow.slurm.operators.job import PreparedJob, fail_task, handle_for, results_root_for
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from tests.harness.slurm_operator_doubles import CFG_WITH_EXTRAS as CFG


def _cfg(**over) -> SlurmConnectionConfig:
    base = dict(conn_id="c", hosts=(("login1", 2222), ("login2", 22)), user="u", insecure_skip_host_key_check=True)
    return SlurmConnectionConfig(**{**base, **over})


SPEC = SimpleNamespace(
    job_name="npa-x-t1", stdout_path="/r/logs/%x.out", stderr_path="/r/logs/%x.err", partition="gpu", time_minutes=90
)


def test_from_spec_takes_name_logs_partition_and_time_from_the_spec():
    job = PreparedJob.from_spec(SPEC, "#!/bin/bash\n", script_path="/r/s.sbatch", results_dir="/r/out")
    assert job.job_name == "npa-x-t1"
    assert job.script == "#!/bin/bash\n"
    assert (job.stdout_path, job.stderr_path) == ("/r/logs/%x.out", "/r/logs/%x.err")
    assert job.partition == "gpu" and job.time_minutes == 90
    assert job.wall_seconds == 5400
    assert (job.script_path, job.results_dir) == ("/r/s.sbatch", "/r/out")
    assert job.mkdirs == () and job.sbatch_args == () and job.secret_values == ()


def test_from_spec_passes_the_other_fields_through():
    job = PreparedJob.from_spec(
        SPEC, "s", script_path="/p", results_dir="/d", mkdirs=("/d",), sbatch_args=("--exclude=c1",)
    )
    assert job.mkdirs == ("/d",) and job.sbatch_args == ("--exclude=c1",)


def test_secret_values_stay_out_of_the_repr():
    job = PreparedJob.from_spec(SPEC, "s", script_path="/p", results_dir="/d", secret_values=("hunter2",))
    assert "hunter2" not in repr(job)


def test_results_root_prefers_the_operator_override():
    assert results_root_for(CFG, "/scratch/mine", "slurm_default") == "/scratch/mine"
    assert results_root_for(CFG, None, "slurm_default") == "/lustre/results"


@pytest.mark.parametrize(
    ("given", "expected"),
    [("lustre:///scratch/r/", "/scratch/r"), ("/scratch/r//", "/scratch/r"), ("slurm:///a/b", "/a/b")],
)
def test_results_root_is_normalised_without_a_trailing_slash(given, expected):
    assert results_root_for(_cfg(), given, "c") == expected


def test_results_root_missing_everywhere_names_the_connection():
    with pytest.raises(NpaValidationError, match=r"results_root is not set and connection 'site' has no results_root"):
        results_root_for(_cfg(), None, "site")
    with pytest.raises(NpaValidationError, match="results_root is not set"):
        results_root_for(_cfg(), "", "site")


@pytest.mark.parametrize("bad", ["relative/dir", "s3://bucket/x", "file:///tmp/x"])
def test_results_root_off_shared_storage_is_refused(bad):
    with pytest.raises(NpaValidationError, match="results_root"):
        results_root_for(_cfg(), bad, "c")


def _job() -> PreparedJob:
    return PreparedJob(
        job_name="npa-x-t2",
        script="s",
        script_path="/r/s.sbatch",
        results_dir="/r/out",
        stdout_path="/r/logs/%x/%j.out",
        stderr_path="/r/logs/%x-%j.err",
    )


def test_handle_for_resolves_the_log_paths_and_names_the_first_login_host(monkeypatch):
    monkeypatch.setattr(job_module.time, "time", lambda: 1234.5)
    handle = handle_for("site", _cfg(cluster_name="alpha"), _job(), 987, try_number=2, retry_of="986")
    assert isinstance(handle, SlurmJobHandle)
    assert handle == SlurmJobHandle(
        conn_id="site",
        cluster="alpha",
        job_id="987",
        job_name="npa-x-t2",
        login_host="login1:2222",
        results_dir="/r/out",
        stdout_path="/r/logs/npa-x-t2/987.out",
        stderr_path="/r/logs/npa-x-t2-987.err",
        try_number=2,
        retry_of="986",
        submitted_at=1234.5,
        script_path="/r/s.sbatch",
    )


def test_handle_for_prefers_the_cluster_sbatch_reported():
    assert handle_for("site", _cfg(cluster_name="alpha"), _job(), "1", try_number=1, retry_of=None).cluster == "alpha"
    assert handle_for("site", _cfg(), _job(), "1", try_number=1, retry_of=None).cluster is None
    reported = handle_for("site", _cfg(cluster_name="alpha"), _job(), "1", try_number=1, retry_of=None, cluster="b")
    assert reported.cluster == "b"


def test_fail_task_is_an_error_that_is_not_retried():
    err = fail_task("cannot help")
    assert isinstance(err, AirflowFailException) and str(err) == "cannot help"
