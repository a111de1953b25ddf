"""What a handle read back from XCom may make the API server act on (npa_airflow.trusted_jobs), pure."""

from __future__ import annotations

import pytest

from npa_airflow.common.deployment import Deployment
from npa_airflow.common.naming import job_name_for, legacy_job_name_for
from npa_airflow.slurm.submit import layout
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from npa_airflow.trusted_jobs import (
    Distrust,
    TaskInstanceRef,
    TaskSettings,
    dropped_paths,
    slurm_job_names,
    trusted_burst_try,
    trusted_slurm_handle,
)

PROD = Deployment("prod-key-0123456789abcdef", 100.0, "test")
STAGING = Deployment("staging-key-0123456789abcd", 100.0, "test")
TI = TaskInstanceRef("train_daily", "train", "scheduled__2026-12-04T00:00:00+00:00", 3, 2)
CONFIG = SlurmConnectionConfig(conn_id="slurm", hosts=(("h", 22),), user="npa", results_root="/lustre/r")
SETTINGS = TaskSettings("slurm", results_root="/lustre/own")


def name(try_number=1, deployment=PROD):
    return job_name_for(*TI.identity[:4], try_number, deployment=deployment)


def handle(job_name=None, root="/lustre/r", **changes):
    job = job_name or name()
    return {
        "conn_id": "slurm", "cluster": None, "job_id": "7", "job_name": job, "login_host": "h:22",
        "results_dir": f"{root}/{job}", "stdout_path": f"{root}/slurm-logs/{job}/main.out",
        "stderr_path": f"{root}/slurm-logs/{job}/main.err", "try_number": 1,
        "script_path": layout.script_path(root, job), "env_file": layout.sidecar_path(root, job), **changes,
    }  # fmt: skip


def trusted(raw, settings=SETTINGS, deployment=PROD, config=CONFIG):
    return trusted_slurm_handle(raw, TI, settings, deployment, config)


def test_the_names_of_every_try_so_far_both_namings():
    names = slurm_job_names(TI, PROD)
    assert names == {
        name(1),
        name(2),
        legacy_job_name_for(*TI.identity[:4], 1),
        legacy_job_name_for(*TI.identity[:4], 2),
    }


@pytest.mark.parametrize("root", ["/lustre/r", "/lustre/own"])
def test_the_task_s_own_handle_keeps_its_paths_under_either_results_root(root):
    job = trusted(handle(root=root))
    assert not isinstance(job, Distrust)
    assert job.script_path == f"{root}/sbatch/{name()}.sbatch" and job.env_file == f"{root}/sidecars/{name()}.env"


def test_a_probe_s_knob_set_job_and_its_script_are_the_task_s():
    probe = name(2).replace("-t2", "-k1-t2")
    job = trusted(handle(probe, script_path=layout.probe_script_path("/lustre/r", probe), env_file=None))
    assert not isinstance(job, Distrust) and job.script_path == f"/lustre/r/{probe}/probe.sbatch"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (handle(name(1, STAGING)), "is not the name of any try"),  # staging's job, same dag/task/run
        (handle(name(3)), "is not the name of any try"),
        (handle(conn_id="other"), "connection 'other' is not the task's ('slurm')"),
        (handle(cluster="b"), "cluster 'b' is not the connection's (None)"),
        ({**handle(), "job_id": "7; reboot"}, "malformed"),
        ([], "malformed"),
    ],
)
def test_a_handle_that_is_not_the_task_s_own_is_distrusted(raw, why):
    verdict = trusted(raw)
    assert isinstance(verdict, Distrust) and why in verdict.reason


def test_without_the_task_s_connection_nothing_is_trusted():
    assert isinstance(trusted(handle(), settings=TaskSettings(None)), Distrust)


@pytest.mark.parametrize(
    "paths",
    [
        {"script_path": "/home/victim/.bashrc", "env_file": "/etc/shadow"},
        {"script_path": f"/tmp/sbatch/{name()}.sbatch", "env_file": f"/tmp/sidecars/{name()}.env"},  # another root
        {"script_path": f"/lustre/r/sbatch/{name(2)}.sbatch", "env_file": f"/lustre/r/sidecars/{name(2)}.env"},
    ],
)
def test_paths_the_layout_does_not_derive_are_dropped(paths):
    raw = handle(**paths)
    job = trusted(raw)
    assert job.script_path is None and job.env_file is None
    assert dropped_paths(raw, job) == [f"script_path={paths['script_path']!r}", f"env_file={paths['env_file']!r}"]


def test_a_templated_results_root_in_the_dag_file_derives_nothing():
    job = trusted(handle(root="/lustre/own"), settings=TaskSettings("slurm", results_root="{{ var.value.root }}"))
    assert job.script_path is None


def test_a_burst_handle_points_at_one_of_the_task_s_tries():
    from npa_airflow.burst.tries import try_refs

    first, second = try_refs(TI.identity, PROD, None)
    raw = {
        "conn_id": "sky",
        "endpoint": "https://sky",
        "cluster": second.cluster,
        "name": "n",
        "request_id": "0123456789ab",
    }
    assert trusted_burst_try(raw, TI, TaskSettings("sky"), PROD) == second
    assert trusted_burst_try({**raw, "try_name": first.try_name}, TI, TaskSettings("sky"), PROD).reason
    staging = try_refs(TI.identity, STAGING, None)[0]
    assert (
        "is not one of" in trusted_burst_try({**raw, "cluster": staging.cluster}, TI, TaskSettings("sky"), PROD).reason
    )
    pinned = trusted_burst_try(
        {**raw, "cluster": "shared", "try_name": first.try_name}, TI, TaskSettings("sky", cluster_name="shared"), PROD
    )
    assert pinned.try_number == 1 and pinned.pinned


def test_the_settings_of_a_serialized_task_fall_back_to_partial_then_to_the_operators_default():
    """A mapped task keeps only what `.partial()` was given: its connection is then the operator's default (the
    listener used to find none and left such a task's job running)."""
    import json

    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    from npa_airflow.slurm.operators import SlurmSubmitOperator
    from npa_airflow.trusted_jobs import settings_of

    job = {"partition": "cpu", "gpus_per_node": 0}
    with DAG("npa_unit_settings", schedule=None) as dag:
        SlurmSubmitOperator.partial(task_id="defaulted", **job).expand(command=["a"])
        SlurmSubmitOperator.partial(task_id="given", slurm_conn_id="slurm_b", results_root="/r", **job).expand(
            command=["a"]
        )
        SlurmSubmitOperator(task_id="plain", command="a", slurm_conn_id="slurm_c", **job)
    tasks = DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag)))).task_dict
    assert settings_of(tasks["defaulted"], "slurm_conn_id").conn_id == "slurm_default"
    given = settings_of(tasks["given"], "slurm_conn_id")
    assert (given.conn_id, given.results_root) == ("slurm_b", "/r")
    assert settings_of(tasks["plain"], "slurm_conn_id").conn_id == "slurm_c"
