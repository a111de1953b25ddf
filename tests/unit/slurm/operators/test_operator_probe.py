"""SlurmNcclProbeOperator: one step (and job name) per knob set, the gate, parse-time checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands import SubmitResult
from npa_airflow.slurm.operators import SlurmNcclProbeOperator
from npa_airflow.slurm.triggers import make_event_payload
from tests.harness.slurm_operator_doubles import CFG_WITH_EXTRAS as CFG
from tests.harness.slurm_operator_doubles import HookDouble, context, handle_dict


def test_probe_job_names_carry_the_knob_index() -> None:
    op = SlurmNcclProbeOperator(task_id="probe")
    ti = SimpleNamespace(dag_id="d", task_id="probe", run_id="r1", map_index=-1, try_number=2)
    name = op.job_name_for_knob_set({"ti": ti}, 1)
    assert name.endswith("-k1-t2") and name.startswith("npa-d-probe-")


def test_probe_gate_returns_no_env_without_touching_the_cluster() -> None:
    op = SlurmNcclProbeOperator(task_id="probe", nodes=1, gpus_per_node=1)
    assert op.execute({}) == {}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"nodes": 0}, "nodes=0"),
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"knob_sets": []}, "non-empty list"),
        ({"knob_sets": [{"MASTER_PORT": "1"}]}, "set by the probe itself"),
    ],
)
def test_probe_rejects_bad_arguments_at_parse_time(kwargs: dict, fragment: str) -> None:
    with pytest.raises(NpaValidationError, match=fragment):
        SlurmNcclProbeOperator(task_id="probe", **kwargs)


def probe_with(hook: HookDouble) -> SlurmNcclProbeOperator:
    op = SlurmNcclProbeOperator(task_id="train", slurm_conn_id="slurm_unit", partition="cpu", use_cache=False)
    op.get_hook = lambda: hook
    return op


def probe_event(op: SlurmNcclProbeOperator, ctx: dict, knob_index: int, status: str, **extra) -> dict:
    handle = {**handle_dict(), "job_name": op.job_name_for_knob_set(ctx, knob_index)}
    return make_event_payload(status, handle, f"probe {status}", **extra)


def test_a_hung_probe_defers_the_next_knob_set_with_its_index_in_the_kwargs() -> None:
    hook = HookDouble(config=CFG, submit_outcomes=[SubmitResult(job_id="8", cluster=None)])
    op = probe_with(hook)
    ctx = context()
    hung = probe_event(op, ctx, 0, "failed", native_state="TIMEOUT", exit_code=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.probe_complete(ctx, hung, knob_index=0)
    assert deferred.value.method_name == "probe_complete"
    assert deferred.value.kwargs == {"knob_index": 1}
    assert deferred.value.trigger.handle.job_name == op.job_name_for_knob_set(ctx, 1)
    assert "NCCL_P2P_DISABLE" in op.probe_script  # the second knob set was submitted


def test_a_passing_probe_returns_the_knob_set_of_its_step() -> None:
    op = probe_with(HookDouble(config=CFG))
    ctx = context()
    assert op.probe_complete(ctx, probe_event(op, ctx, 1, "success"), knob_index=1) == op.knob_sets[1]


def test_the_last_hung_knob_set_fails_the_probe() -> None:
    op = probe_with(HookDouble(config=CFG))
    ctx = context()
    last = len(op.knob_sets) - 1
    with pytest.raises(AirflowFailException, match="hung with every knob set"):
        op.probe_complete(ctx, probe_event(op, ctx, last, "failed", native_state="TIMEOUT"), knob_index=last)


def test_a_resume_without_the_deferral_kwargs_finds_the_knob_set_by_its_job():
    """Airflow 3.3.2's dag.test() resumes with {"event": ...} only; the knob set is still the right one."""
    op = probe_with(HookDouble(config=CFG))
    ctx = context()
    assert op.probe_complete(ctx, probe_event(op, ctx, 1, "success")) == op.knob_sets[1]
    foreign = make_event_payload("success", {**handle_dict(), "job_name": "npa-other-0123456789-k1-t1"}, "ok")
    with pytest.raises(AirflowFailException, match="none of this try's knob-set jobs"):
        op.probe_complete(ctx, foreign)


def test_dag_test_drops_the_deferral_kwargs_on_resume():
    """The Airflow behaviour the fallback above exists for: if dag.test() starts keeping the kwargs, this fails
    and the fallback can go."""
    import inspect

    from airflow.sdk.definitions import dag as dag_module

    source = inspect.getsource(dag_module)
    assert 'ti.next_kwargs = {"event": serialize(event.payload)} if event else msg.next_kwargs' in source
