"""One vocabulary across backends: Burst's old argument names still work, warn, and build the same SkyPilot task.

New names: command, environment, secret_env, max_wait (both backends), accelerators (Burst's SkyPilot spec; Slurm's
gpus_per_node is a count and keeps its name). Old: entrypoint, envs, secret_conn_ids, deadline, gpu_per_node.
"""

from __future__ import annotations

import warnings
from datetime import timedelta

import pendulum
import pytest

from npa_airflow.exceptions import NpaValidationError

START = pendulum.datetime(2026, 1, 1)
NEW = dict(
    accelerators="H100:8",
    command="python train.py --config c.yaml",
    environment={"HF_HOME": "/data/hf"},
    secret_env={"HF_TOKEN": "conn:hf_token"},
    max_wait=timedelta(hours=4),
)
OLD = dict(
    gpu_per_node="H100:8",
    entrypoint="python train.py --config c.yaml",
    envs={"HF_HOME": "/data/hf"},
    secret_conn_ids={"HF_TOKEN": "hf_token"},
    deadline=4 * 3600,
)
RENAMED = {"gpu_per_node": "accelerators", "entrypoint": "command", "envs": "environment"}
RENAMED |= {"secret_conn_ids": "secret_env", "deadline": "max_wait"}


def _torchrun(task_id="train", **kwargs):
    from npa_airflow.burst.operators import BurstTorchrunOperator

    return BurstTorchrunOperator(task_id=task_id, image="nvcr.io/nvidia/pytorch:25.01-py3", nodes=2, **kwargs)


def _skypilot_task(op, monkeypatch):
    """The SkyPilot task dict the operator launches (secrets resolved from an env-var connection)."""
    monkeypatch.setenv("AIRFLOW_CONN_HF_TOKEN", '{"conn_type": "generic", "password": "hf-secret-value"}')
    task, nodes = op.build_task_dict({}, {})
    return task, nodes


def test_the_new_names_build_the_task_without_a_warning(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op = _torchrun(**NEW)
    task, nodes = _skypilot_task(op, monkeypatch)
    assert nodes == 2 and task["resources"]["accelerators"] == "H100:8"
    assert task["envs"] == {"HF_HOME": "/data/hf"} and task["secrets"] == {"HF_TOKEN": "hf-secret-value"}
    assert task["run"].rstrip().endswith("python \\\n  train.py \\\n  --config \\\n  c.yaml")
    assert op.max_wait == timedelta(hours=4)


def test_the_old_names_warn_at_the_dag_line_and_build_the_identical_task(monkeypatch):
    with pytest.warns(DeprecationWarning) as caught:
        old = _torchrun(**OLD)
    said = {str(w.message) for w in caught}
    for old_name, new_name in RENAMED.items():
        assert f"BurstTorchrunOperator(task_id='train'): {old_name}= is deprecated, use {new_name}=" in "\n".join(said)
    assert {w.filename for w in caught} == {__file__}
    new = _torchrun(**NEW)
    assert _skypilot_task(old, monkeypatch) == _skypilot_task(new, monkeypatch)
    assert old.spec() == new.spec()
    assert (old.secret_env, old.max_wait) == (new.secret_env, new.max_wait)


@pytest.mark.parametrize("old_name", sorted(RENAMED))
def test_each_old_name_alone_works_and_warns(old_name):
    kwargs = {**NEW, old_name: OLD[old_name]}
    del kwargs[RENAMED[old_name]]
    with pytest.warns(DeprecationWarning, match=f"{old_name}= is deprecated, use {RENAMED[old_name]}="):
        op = _torchrun(**kwargs)
    new = _torchrun(**NEW)
    assert op.spec() == new.spec() and op.secret_env == new.secret_env and op.max_wait == new.max_wait


@pytest.mark.parametrize("old_name", sorted(RENAMED))
def test_both_names_are_an_error_at_parse_time(old_name):
    new_name = RENAMED[old_name]
    with pytest.raises(NpaValidationError, match=f"both {new_name}= and {old_name}= given"):
        _torchrun(**NEW, **{old_name: OLD[old_name]})


def test_a_missing_command_or_accelerators_names_the_new_argument():
    with pytest.raises(TypeError, match="missing keyword argument 'command'"):
        _torchrun(accelerators="H100:8")
    with pytest.raises(TypeError, match="missing keyword argument 'accelerators'"):
        _torchrun(command="python t.py")


def test_bad_values_are_reported_under_the_new_names():
    with pytest.raises(NpaValidationError, match="max_wait=0"):
        _torchrun(**{**NEW, "max_wait": 0})
    with pytest.raises(NpaValidationError, match="secret_env\\['HF_TOKEN'\\]"):
        _torchrun(**{**NEW, "secret_env": {"HF_TOKEN": "plain-secret-value"}})
    with pytest.raises(NpaValidationError, match="accelerators='H100'"):
        _torchrun(**{**NEW, "accelerators": "H100"}).spec()


def test_secret_env_takes_a_variable_too(monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_WANDB_KEY", "wandb-secret-value")
    op = _torchrun(**{**NEW, "secret_env": {"WANDB_API_KEY": "var:WANDB_KEY"}})
    task, _ = op.build_task_dict({}, {})
    assert task["secrets"] == {"WANDB_API_KEY": "wandb-secret-value"}


def test_default_args_apply_the_new_name_to_burst_and_an_explicit_old_name_wins():
    from airflow.sdk import DAG

    from npa_airflow.slurm.operators import SlurmSubmitOperator

    with DAG("vocab", schedule=None, start_date=START, default_args={"max_wait": timedelta(hours=1)}):
        slurm = SlurmSubmitOperator(task_id="slurm", command="true", gpus_per_node=0)
        burst = _torchrun("burst", accelerators="GPU:1", command="true")
        with pytest.warns(DeprecationWarning, match="deadline="):
            explicit = _torchrun("explicit", accelerators="GPU:1", command="true", deadline=60)
    assert slurm.max_wait == burst.max_wait == timedelta(hours=1)
    assert explicit.max_wait == timedelta(seconds=60)


def test_mapped_tasks_accept_the_old_names():
    from airflow.sdk import DAG

    from npa_airflow.burst.operators import BurstTorchrunOperator

    with DAG("vocab_mapped", schedule=None, start_date=START):
        mapped = BurstTorchrunOperator.partial(task_id="m", image=None, nodes=1, entrypoint="true").expand(
            gpu_per_node=["GPU:1", "GPU:2"]
        )
    assert mapped.partial_kwargs["entrypoint"] == "true"


def test_the_probe_takes_environment_under_either_name():
    from npa_airflow.burst.operators import BurstNcclProbeOperator

    new = BurstNcclProbeOperator(task_id="p", image=None, nodes=2, accelerators="H100:8", environment={"A": "1"})
    with pytest.warns(DeprecationWarning, match="envs= is deprecated"):
        old = BurstNcclProbeOperator(task_id="p", image=None, nodes=2, gpu_per_node="H100:8", envs={"A": "1"})
    assert old.spec() == new.spec()
    assert new.environment == {"A": "1", "NPA_PROBE_COLLECTIVE_TIMEOUT": "300"}
    assert new.command == "nccl_allreduce_probe.py"


def test_submit_yaml_takes_max_wait_or_deadline():
    from npa_airflow.burst.operators import BurstSubmitYamlOperator

    assert BurstSubmitYamlOperator(task_id="y", yaml_path="t.yaml", max_wait=120).max_wait == timedelta(minutes=2)
    with pytest.warns(DeprecationWarning, match="deadline= is deprecated, use max_wait="):
        old = BurstSubmitYamlOperator(task_id="y", yaml_path="t.yaml", deadline=timedelta(minutes=2))
    assert old.max_wait == timedelta(minutes=2)


def test_slurm_max_wait_takes_seconds_like_burst():
    from npa_airflow.slurm.operators import SlurmSubmitOperator

    op = SlurmSubmitOperator(task_id="t", command="true", gpus_per_node=0, max_wait=1800)
    assert op.max_wait == timedelta(minutes=30)
    with pytest.raises(NpaValidationError, match="max_wait=-1"):
        SlurmSubmitOperator(task_id="t", command="true", gpus_per_node=0, max_wait=-1)


def test_template_fields_use_the_new_names_and_the_trust_checks_fields_are_serialized():
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    from npa_airflow.burst.operators import BurstTorchrunOperator

    assert {"accelerators", "command", "environment"} <= set(BurstTorchrunOperator.template_fields)
    assert not {"gpu_per_node", "entrypoint", "envs"} & set(BurstTorchrunOperator.template_fields)
    assert BurstTorchrunOperator.template_fields_renderers["environment"] == "json"
    assert {"skypilot_conn_id", "cluster_name"} <= BurstTorchrunOperator.get_serialized_fields()

    def round_trip(**kwargs):
        with DAG("vocab_serialized", schedule=None, start_date=START) as dag:
            _torchrun(skypilot_conn_id="sky_prod", cluster_name="pinned", **kwargs)
        return DagSerialization.from_dict(DagSerialization.to_dict(dag)).task_dict["train"]

    new = round_trip(**NEW)
    with pytest.warns(DeprecationWarning):
        old = round_trip(**OLD)
    for name in ("accelerators", "command", "environment", "skypilot_conn_id", "cluster_name"):
        assert getattr(old, name) == getattr(new, name), name
    assert (new.skypilot_conn_id, new.cluster_name, new.accelerators) == ("sky_prod", "pinned", "H100:8")
