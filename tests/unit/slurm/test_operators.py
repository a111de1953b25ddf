"""SlurmSubmitOperator / SlurmJobOperatorBase decisions, without a cluster.

`HookDouble` is a test double for SlurmHook's sync facade (the boundary): it records calls and answers
with scripted jobs, so each decision (adopt, reattach, cancel, reconcile, classify) is checked exactly.
The same paths run against the real cluster in tests/integration/test_slurm_operator.py.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from npa_airflow.common.defaults import default_deferrable
from npa_airflow.common.naming import job_name_for
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaValidationError
from npa_airflow.slurm import operators as ops
from npa_airflow.slurm.commands import LogChunk, PartitionInfo, SlurmJobInfo, SubmitResult
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.operators import SlurmSubmitOperator
from npa_airflow.slurm.triggers import SlurmJobTrigger, make_event_payload

CONN = {
    "conn_type": "slurm",
    "host": "127.0.0.1",
    "port": 2222,
    "login": "npa",
    "extra": {"results_root": "/shared/results", "partition": "cpu", "insecure_skip_host_key_check": True},
}


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_UNIT", json.dumps(CONN))
    monkeypatch.setattr(ops, "RECONCILE_WINDOW_SECONDS", 0.05)
    monkeypatch.setattr(ops, "RECONCILE_POLL_SECONDS", 0.01)


def job(job_id: str, name: str, state: JobState, native: str | None = None, **kw) -> SlurmJobInfo:
    return SlurmJobInfo(
        job_id=job_id,
        native_state=native or state.value,
        state=state,
        exit_code=kw.get("exit_code"),
        signal=None,
        job_name=name,
        node_list=kw.get("node_list", "c1"),
        reason=None,
        source="sacct",
    )


@dataclass
class HookDouble:
    """Test double for SlurmHook (sync facade)."""

    existing: list[SlurmJobInfo] = field(default_factory=list)
    submit_outcomes: list[object] = field(default_factory=list)  # SubmitResult or an exception to raise
    appear_after_ambiguous: list[SlurmJobInfo] = field(default_factory=list)
    calls: list[tuple] = field(default_factory=list)
    config: SlurmConnectionConfig = field(
        default_factory=lambda: SlurmConnectionConfig(conn_id="slurm_unit", hosts=(("127.0.0.1", 2222),), user="npa")
    )

    def find_jobs_by_name(self, names):
        self.calls.append(("find", tuple(names)))
        return [j for j in self.existing if j.job_name in names]

    def cancel(self, job_id):
        self.calls.append(("cancel", job_id))

    def stage_and_submit(self, files, script_path, **kwargs):
        self.calls.append(("submit", script_path, tuple(f.path for f in files), kwargs))
        outcome = self.submit_outcomes.pop(0)
        if isinstance(outcome, Exception):
            self.existing.extend(self.appear_after_ambiguous)
            raise outcome
        return outcome

    def partitions(self):
        self.calls.append(("partitions",))
        return {"cpu": PartitionInfo(name="cpu", max_time_minutes=120, default=True, state="UP", nodes="c[1-2]")}

    def nodes(self):
        return {"c1": object(), "c2": object()}

    def tail_logs(self, requests, max_bytes=1 << 20):
        return [
            LogChunk(path=p, data=b"Traceback\nValueError: bad config\n"[-max_bytes:], offset=o, size=40)
            for p, o in requests
        ]


def context(try_number: int = 1, map_index: int = -1):
    ti = types.SimpleNamespace(
        dag_id="train_dag",
        task_id="train",
        run_id="manual__2026-12-02",
        map_index=map_index,
        try_number=try_number,
        pushed={},
    )
    ti.xcom_push = lambda key, value: ti.pushed.__setitem__(key, value)
    return {"ti": ti}


def make_op(hook: HookDouble, **kwargs) -> SlurmSubmitOperator:
    defaults = dict(
        task_id="train",
        slurm_conn_id="slurm_unit",
        command="echo hello",
        gpus_per_node=0,
        cpus_per_task=1,
        time_hours=0.1,
        partition="cpu",
    )
    defaults.update(kwargs)
    op = SlurmSubmitOperator(**defaults)
    op.get_hook = lambda: hook
    return op


def name(try_number: int) -> str:
    return job_name_for("train_dag", "train", "manual__2026-12-02", -1, try_number)


# -- parse-time and render-time validation ------------------------------------------------------------


def test_bad_arguments_fail_at_parse_time():
    with pytest.raises(NpaValidationError, match="on_previous_try='resubmit'"):
        SlurmSubmitOperator(task_id="t", command="x", on_previous_try="resubmit")
    with pytest.raises(NpaValidationError, match="nodes=0"):
        SlurmSubmitOperator(task_id="t", command="x", nodes=0)
    with pytest.raises(NpaValidationError, match="gpus_per_node=9"):
        SlurmSubmitOperator(task_id="t", command="x", gpus_per_node=9)
    with pytest.raises(NpaValidationError, match="never the secret itself"):
        SlurmSubmitOperator(task_id="t", command="x", secret_env={"HF_TOKEN": "hf_abcdefabcdefabcdef"})
    with pytest.raises(NpaValidationError, match="poll_interval"):
        SlurmSubmitOperator(task_id="t", command="x", poll_interval=0)


def test_rendered_template_is_the_exact_script_with_the_try_job_name():
    op = make_op(HookDouble(), nodes=2, command="echo rank $NODE_RANK of $WORLD_SIZE in {results_dir}")
    op.render_template_fields(context(try_number=3))
    script = op.sbatch_script
    assert f"#SBATCH --job-name={name(3)}" in script
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=cpu" in script
    assert "export WORLD_SIZE=2" in script and 'NODE_RANK="${SLURM_NODEID}"' in script
    assert f"/shared/results/{name(3)}" in script  # {results_dir} bound to this try's own directory
    assert "{results_dir}" not in script


def test_local_inputs_are_rejected_before_anything_runs():
    op = make_op(HookDouble(), inputs=["file:///home/me/data"])
    with pytest.raises(NpaValidationError, match="compute nodes cannot read"):
        op.render_template_fields(context())
    op = make_op(HookDouble(), inputs=["data/train"])
    with pytest.raises(NpaValidationError, match="relative"):
        op.render_template_fields(context())


def test_default_deferrable(monkeypatch):
    monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    assert default_deferrable() is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "false")
    assert default_deferrable() is False
    assert SlurmSubmitOperator(task_id="t", command="x").deferrable is False
    assert SlurmSubmitOperator(task_id="t", command="x", deferrable=True).deferrable is True


# -- submit, adopt, reattach, reconcile ---------------------------------------------------------------


def run_execute(op: SlurmSubmitOperator, ctx) -> SlurmJobTrigger:
    op.render_template_fields(ctx)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return deferred.value.trigger


def test_fresh_submission_stages_script_and_defers_with_handle():
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="101", cluster=None)])
    op = make_op(hook)
    ctx = context()
    trigger = run_execute(op, ctx)
    submits = [c for c in hook.calls if c[0] == "submit"]
    assert len(submits) == 1
    assert submits[0][1] == f"/shared/results/sbatch/{name(1)}.sbatch"
    assert ctx["ti"].pushed["slurm_job"]["job_id"] == "101"
    assert trigger.handle == ctx["ti"].pushed["slurm_job"]
    assert trigger.require_marker == "status.json"
    assert trigger.handle["stdout_path"] == f"/shared/results/slurm-logs/{name(1)}/main.out"
    assert hook.calls[0] == ("partitions",)  # validated before anything else touches the cluster


def test_wall_time_above_partition_max_is_refused_before_submit():
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="1", cluster=None)])
    op = make_op(hook, time_hours=3.0)
    op.render_template_fields(context())
    with pytest.raises(NpaValidationError, match="allows at most 120 min"):
        op.execute(context())
    assert not [c for c in hook.calls if c[0] in ("submit", "cancel")]


def test_same_try_job_is_adopted_not_resubmitted():
    hook = HookDouble(existing=[job("55", name(1), JobState.RUNNING)])
    trigger = run_execute(make_op(hook), context())
    assert trigger.handle["job_id"] == "55"
    assert not [c for c in hook.calls if c[0] == "submit"]


def test_live_job_of_earlier_try_is_reattached_by_default():
    hook = HookDouble(existing=[job("41", name(1), JobState.RUNNING)])
    trigger = run_execute(make_op(hook), context(try_number=2))
    assert trigger.handle["job_id"] == "41" and trigger.handle["job_name"] == name(1)
    assert ("find", (name(1), name(2))) in hook.calls
    assert not [c for c in hook.calls if c[0] in ("submit", "cancel")]


def test_live_job_of_earlier_try_is_cancelled_by_option():
    hook = HookDouble(
        existing=[job("41", name(1), JobState.RUNNING)],
        submit_outcomes=[SubmitResult(job_id="42", cluster=None)],
    )
    trigger = run_execute(make_op(hook, on_previous_try="cancel"), context(try_number=2))
    assert ("cancel", "41") in hook.calls
    assert trigger.handle["job_id"] == "42" and trigger.handle["retry_of"] == "41"


def test_ambiguous_submission_adopts_the_one_job_that_exists():
    hook = HookDouble(
        submit_outcomes=[NpaAmbiguousSubmission("connection lost during submission")],
        appear_after_ambiguous=[job("77", name(1), JobState.PENDING)],
    )
    trigger = run_execute(make_op(hook), context())
    assert trigger.handle["job_id"] == "77"
    assert len([c for c in hook.calls if c[0] == "submit"]) == 1


def test_ambiguous_submission_with_two_matches_cancels_both_and_stops():
    hook = HookDouble(
        submit_outcomes=[NpaAmbiguousSubmission("sbatch printed nothing")],
        appear_after_ambiguous=[job("77", name(1), JobState.PENDING), job("78", name(1), JobState.PENDING)],
    )
    op = make_op(hook)
    op.render_template_fields(context())
    with pytest.raises(NpaAmbiguousSubmission, match="2 Slurm jobs are named"):
        op.execute(context())
    assert ("cancel", "77") in hook.calls and ("cancel", "78") in hook.calls


def test_ambiguous_submission_with_no_job_after_the_window_resubmits_once():
    hook = HookDouble(
        submit_outcomes=[NpaAmbiguousSubmission("connection lost"), SubmitResult(job_id="90", cluster=None)]
    )
    trigger = run_execute(make_op(hook), context())
    assert trigger.handle["job_id"] == "90"
    assert len([c for c in hook.calls if c[0] == "submit"]) == 2


# -- completion ---------------------------------------------------------------------------------------


def handle_dict(job_id="101"):
    return {
        "conn_id": "slurm_unit",
        "cluster": None,
        "job_id": job_id,
        "job_name": name(1),
        "login_host": "127.0.0.1:2222",
        "results_dir": f"/shared/results/{name(1)}",
        "stdout_path": f"/shared/results/slurm-logs/{name(1)}/main.out",
        "stderr_path": f"/shared/results/slurm-logs/{name(1)}/main.err",
        "try_number": 1,
        "retry_of": None,
        "submitted_at": 1.0,
    }


def test_execute_complete_success_returns_the_handle():
    op = make_op(HookDouble())
    event = make_event_payload("success", handle_dict(), "done")
    assert op.execute_complete(context(), event) == handle_dict()


def test_execute_complete_rejects_a_malformed_event():
    op = make_op(HookDouble())
    with pytest.raises(AirflowException, match="unusable event"):
        op.execute_complete(context(), {"status": "success"})


def test_program_failure_fails_without_retry_and_shows_the_tail():
    op = make_op(HookDouble())
    event = make_event_payload(
        "failed", handle_dict(), "Slurm job 101 ended FAILED (exit code 3)", state="ERROR", native_state="FAILED",
        exit_code=3, signal=None, node_list="c1", reason=None, log_tail="",
    )  # fmt: skip
    with pytest.raises(AirflowFailException) as err:
        op.execute_complete(context(), event)
    assert "ValueError: bad config" in str(err.value) and "not retried" in str(err.value)


def test_deadline_cancels_the_job_then_fails():
    hook = HookDouble()
    op = make_op(hook)
    with pytest.raises(AirflowException, match="deadline"):
        op.execute_complete(context(), make_event_payload("deadline", handle_dict(), "late"))
    assert ("cancel", "101") in hook.calls


def test_on_kill_cancels_only_a_job_that_is_still_ours():
    hook = HookDouble()
    op = make_op(hook)
    op.on_kill()
    assert hook.calls == []
    from npa_airflow.slurm.handle import SlurmJobHandle

    op._handle = SlurmJobHandle.from_dict(handle_dict())
    op.on_kill()
    assert hook.calls == [("cancel", "101")]


def test_infra_failure_is_retryable_and_names_the_evidence():
    op = make_op(HookDouble())
    event = make_event_payload(
        "failed", handle_dict(), "Slurm job 101 ended NODE_FAIL", state="ERROR", native_state="NODE_FAIL",
        exit_code=0, signal=None, node_list="c1", reason=None, log_tail="",
    )  # fmt: skip
    with pytest.raises(AirflowException) as err:
        op.execute_complete(context(), event)
    assert not isinstance(err.value, AirflowFailException)
    assert "infrastructure reason (job state NODE_FAIL" in str(err.value)


# -- SlurmJobSensor -----------------------------------------------------------------------------------


def test_sensor_accepts_a_handle_a_rendered_handle_or_a_job_id():
    from npa_airflow.slurm.sensors import parse_job_reference

    assert parse_job_reference(handle_dict()) == handle_dict()
    assert parse_job_reference(json.dumps(handle_dict())) == handle_dict()
    assert parse_job_reference(str(handle_dict())) == handle_dict()  # what a non-native Jinja render gives
    assert parse_job_reference(" 12345_7 ") == "12345_7"
    assert parse_job_reference(42) == "42"
    with pytest.raises(NpaValidationError, match="neither a Slurm job id"):
        parse_job_reference("12345; scancel -u everyone")
    with pytest.raises(NpaValidationError, match="unknown keys"):
        parse_job_reference({**handle_dict(), "evil": 1})


def test_sensor_defers_with_a_trigger_that_never_cancels_someone_elses_job():
    from npa_airflow.slurm.sensors import SlurmJobSensor

    sensor = SlurmJobSensor(task_id="wait", job=handle_dict(), slurm_conn_id="slurm_unit", timeout=600)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context())
    trigger = deferred.value.trigger
    assert trigger.handle == handle_dict() and trigger.cancel_on_kill is False
    assert trigger.deadline is not None
    assert sensor.execute_complete(context(), make_event_payload("success", handle_dict(), "ok")) == handle_dict()
    with pytest.raises(AirflowFailException, match="ended FAILED"):
        sensor.execute_complete(context(), make_event_payload("failed", handle_dict(), "Slurm job 101 ended FAILED"))


# -- SlurmJobLink -------------------------------------------------------------------------------------


def test_job_link_formats_the_site_template_or_points_at_the_xcom_tab(monkeypatch):
    from airflow.models.taskinstancekey import TaskInstanceKey

    from npa_airflow.common import links

    handle = {**handle_dict(), "job_name": "npa-a&b-t1"}
    assert (
        links.format_job_url("https://ood.example/activejobs?jobid={job_id}&name={job_name}", handle)
        == "https://ood.example/activejobs?jobid=101&name=npa-a%26b-t1"
    )
    key = TaskInstanceKey(dag_id="d", task_id="t", run_id="manual__1", try_number=1, map_index=3)
    monkeypatch.setattr(links.XCom, "get_value", staticmethod(lambda key, ti_key: handle))
    monkeypatch.setattr(links, "_job_url_template", lambda conn_id: None)
    assert links.SlurmJobLink().get_link(None, ti_key=key).endswith("/dags/d/runs/manual__1/tasks/t/mapped/3/xcom")
    monkeypatch.setattr(links, "_job_url_template", lambda conn_id: "https://site/job/{job_id}")
    assert links.SlurmJobLink().get_link(None, ti_key=key) == "https://site/job/101"
    monkeypatch.setattr(links.XCom, "get_value", staticmethod(lambda key, ti_key: None))
    assert links.SlurmJobLink().get_link(None, ti_key=key) == ""  # nothing submitted yet


def test_cancel_option_never_cancels_for_a_submission_with_missing_inputs():
    hook = HookDouble(existing=[job("41", name(1), JobState.RUNNING)])
    hook.paths_exist = lambda paths: {p: False for p in paths}
    op = make_op(hook, on_previous_try="cancel", inputs=["lustre:///data/missing"])
    op.render_template_fields(context(try_number=2))
    with pytest.raises(NpaValidationError, match="/data/missing; the earlier try's job 41 was left running"):
        op.execute(context(try_number=2))
    assert not [c for c in hook.calls if c[0] in ("cancel", "submit")]


def test_read_only_queries_ride_out_a_short_controller_outage(monkeypatch):
    from npa_airflow.exceptions import NpaHostKeyError, NpaRemoteError

    monkeypatch.setattr(ops.time, "sleep", lambda s: None)
    op = make_op(HookDouble())
    answers = [NpaRemoteError("slurm_load_partitions error: Socket timed out"), {"cpu": 1}]

    def flaky():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert op.cluster_read("reading partitions", flaky) == {"cpu": 1}

    def untrusted():
        raise NpaHostKeyError("changed host key")

    with pytest.raises(NpaHostKeyError):  # never retried
        op.cluster_read("reading partitions", untrusted)
    monkeypatch.setattr(ops, "READ_RETRY_SECONDS", 0.0)

    def down():
        raise NpaRemoteError("slurm_load_partitions error: Unable to contact slurm controller")

    with pytest.raises(NpaRemoteError):  # bounded: the task fails (and may retry) instead of waiting forever
        op.cluster_read("reading partitions", down)
