"""The operator a triggerer rebuilds from the serialized DAG (start_from_trigger): Airflow's real serialization, both
ways, and Airflow's own expansion order for mapped tasks."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from airflow.sdk import DAG, task
from airflow.serialization.serialized_objects import DagSerialization

from npa_airflow.common.serialized_tasks import (
    INIT_KWARGS_FIELD,
    NotRebuildable,
    expanded_values,
    operator_kwargs,
    own_parameters,
    task_class,
)
from npa_airflow.slurm.operators import SlurmSubmitOperator

RESOURCES = {"partition": "cpu", "gpus_per_node": 0, "cpus_per_task": 1, "time_hours": 0.25}


def round_trip(dag: DAG) -> DAG:
    """The DAG as the scheduler and the triggerer have it: serialized to JSON text and read back."""
    return DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))


def no_xcom(task_id: str, key: str):
    raise AssertionError(f"no XCom expected ({task_id}, {key})")


def test_own_parameters_are_the_operators_and_its_bases_not_airflows():
    params = own_parameters(SlurmSubmitOperator)
    assert {"command", "nodes", "secret_env", "slurm_conn_id", "max_wait", "start_from_trigger"} <= set(params)
    assert not {"task_id", "retries", "execution_timeout", "dag", "kwargs"} & set(params)
    assert params["nodes"] == 1 and params["slurm_conn_id"] == "slurm_default"


def test_an_unmapped_task_is_rebuilt_with_its_arguments_as_given():
    with DAG("npa_unit_rebuild", schedule=None) as dag:
        SlurmSubmitOperator(
            task_id="train",
            command="echo {{ params.x }}",
            environment={"A": "1"},
            secret_env={"TOKEN": "var:token"},
            max_wait=timedelta(minutes=90),
            execution_timeout=timedelta(hours=2),
            retries=3,
            start_from_trigger=True,
            **RESOURCES,
        )
    serialized = round_trip(dag).get_task("train")
    assert serialized.start_from_trigger is True
    assert serialized.start_trigger_args.trigger_cls == "npa_airflow.slurm.start_trigger.SlurmStartTrigger"
    cls = task_class(serialized)
    assert cls is SlurmSubmitOperator
    kwargs = operator_kwargs(serialized, cls, no_xcom, None)
    assert kwargs["command"] == "echo {{ params.x }}" and kwargs["environment"] == {"A": "1"}
    assert kwargs["secret_env"] == {"TOKEN": "var:token"} and kwargs["max_wait"] == timedelta(minutes=90)
    assert kwargs["execution_timeout"] == timedelta(hours=2) and kwargs["retries"] == 3
    rebuilt = cls(task_id="train", **kwargs)
    assert rebuilt.max_wait == timedelta(minutes=90) and rebuilt.start_from_trigger and rebuilt.partition == "cpu"


def test_a_task_without_the_option_carries_no_arguments():
    with DAG("npa_unit_rebuild_off", schedule=None) as dag:
        SlurmSubmitOperator(task_id="train", command="true", **RESOURCES)
    serialized = round_trip(dag).get_task("train")
    assert not serialized.start_from_trigger and getattr(serialized, INIT_KWARGS_FIELD, None) is None


def test_an_xcomarg_argument_is_not_rebuilt_in_the_triggerer():
    with DAG("npa_unit_rebuild_xcomarg", schedule=None) as dag:

        @task
        def env() -> dict:
            return {}

        SlurmSubmitOperator(task_id="train", command="true", environment=env(), start_from_trigger=True, **RESOURCES)
    serialized = round_trip(dag).get_task("train")
    with pytest.raises(NotRebuildable, match="XComArg"):
        operator_kwargs(serialized, SlurmSubmitOperator, no_xcom, None)


def test_a_mapped_task_takes_its_partial_arguments_and_its_map_indexs_values_in_airflows_order():
    commands, conns = ["a", "b", "c"], ["one", "two"]
    with DAG("npa_unit_rebuild_mapped", schedule=None) as dag:
        mapped = SlurmSubmitOperator.partial(task_id="m", start_from_trigger=True, **RESOURCES).expand(
            command=commands, slurm_conn_id=conns
        )
    sdk_input = mapped.expand_input
    lengths = {"command": 3, "slurm_conn_id": 2}
    serialized = round_trip(dag).get_task("m")
    assert serialized.start_from_trigger is True
    for index in range(6):
        kwargs = operator_kwargs(serialized, SlurmSubmitOperator, no_xcom, index)
        expected = {k: sdk_input._expand_mapped_field(k, v, index, lengths) for k, v in sdk_input.value.items()}
        assert {k: kwargs[k] for k in expected} == expected, index
        assert kwargs["partition"] == "cpu" and kwargs["start_from_trigger"] is True


def test_a_mapped_task_over_an_upstream_output_reads_that_xcom_once_per_task_instance():
    with DAG("npa_unit_rebuild_upstream", schedule=None) as dag:

        @task
        def commands() -> list[str]:
            return []

        SlurmSubmitOperator.partial(task_id="m", start_from_trigger=True, **RESOURCES).expand(command=commands())
    serialized = round_trip(dag).get_task("m")
    reads = []

    def xcom(task_id: str, key: str):
        reads.append((task_id, key))
        return ["echo 0", "echo 1"]

    assert expanded_values(serialized, xcom, 1) == {"command": "echo 1"}
    assert reads == [("commands", "return_value")]
    with pytest.raises(NotRebuildable, match="expand"):
        expanded_values(serialized, xcom, -1)
