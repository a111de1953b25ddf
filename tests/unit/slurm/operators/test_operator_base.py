"""The shared Slurm job lifecycle (SlurmJobOperatorBase), driven through SlurmSubmitOperator and a hook double."""

from __future__ import annotations

from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from npa_airflow.common.naming import segment_job_name
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaValidationError
from npa_airflow.slurm.commands import SubmitResult
from npa_airflow.slurm.operators import outage
from npa_airflow.slurm.operators.bad_nodes import BAD_NODES_KEY
from npa_airflow.slurm.triggers import make_event_payload
from tests.harness.slurm_operator_doubles import (
    HookDouble,
    TaskStateStoreDouble,
    context,
    handle_dict,
    install_unit_connection,
    job,
    legacy_name,
    make_op,
    name,
    run_execute,
)


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    install_unit_connection(monkeypatch)


def test_fresh_submission_stages_script_and_defers_with_handle():
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="101", cluster=None)])
    op = make_op(hook)
    ctx = context()
    trigger = run_execute(op, ctx)
    submits = [c for c in hook.calls if c[0] == "submit"]
    assert len(submits) == 1
    assert submits[0][1] == f"/shared/results/sbatch/{name(1)}.sbatch"
    assert ctx["ti"].pushed["slurm_job"]["job_id"] == "101"
    assert trigger.handle.to_dict() == ctx["ti"].pushed["slurm_job"]
    assert trigger.handle.waiting_try == 1  # the try that waits on the job
    assert "slurm_try" not in ctx["ti"].pushed  # one XCom write: each is a round trip to Airflow
    assert trigger.require_marker == "status.json"
    assert trigger.handle.stdout_path == f"/shared/results/slurm-logs/{name(1)}/main.out"
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
    assert trigger.handle.job_id == "55"
    assert not [c for c in hook.calls if c[0] == "submit"]


def test_live_job_of_earlier_try_is_reattached_by_default():
    hook = HookDouble(existing=[job("41", name(1), JobState.RUNNING)])
    trigger = run_execute(make_op(hook), context(try_number=2))
    assert trigger.handle.job_id == "41" and trigger.handle.job_name == name(1)
    # try 1's job, and the jobs it resubmitted after a preemption (max_preemptions=3 by default: segments 2-4)
    earlier = (name(1), *(segment_job_name(name(1), k) for k in (2, 3, 4)))
    assert ("find", (*earlier, name(2), legacy_name(1))) in hook.calls
    assert not [c for c in hook.calls if c[0] in ("submit", "cancel")]


@pytest.mark.parametrize(
    "comment",
    [None, "", "npa1:-:0123456789abcdef01234567", "made by hand"],
    ids=["no comment", "empty", "another deployment's proof", "free text"],
)
@pytest.mark.parametrize("policy", ["reattach", "cancel"])
def test_a_live_job_with_this_task_s_name_but_not_its_proof_is_never_adopted_nor_cancelled(comment, policy, capfd):
    """Another deployment on the same account (or a hand-made job) holds the name: the try submits its own job."""
    foreign = [job("41", name(1), JobState.RUNNING, comment=comment, source="squeue")]
    mine_too = [job("43", name(2), JobState.PENDING, comment=comment, source="squeue")]
    hook = HookDouble(existing=foreign + mine_too, submit_outcomes=[SubmitResult(job_id="42", cluster=None)])
    trigger = run_execute(make_op(hook, on_previous_try=policy), context(try_number=2))
    assert trigger.handle.job_id == "42" and trigger.handle.retry_of is None
    assert not [c for c in hook.calls if c[0] == "cancel"]
    logged = capfd.readouterr().out
    warnings = [line for line in logged.splitlines() if "not this task instance's job" in line]
    assert [w.split("Slurm job ")[1][:2] for w in warnings] == ["41", "43"]


def test_an_ended_job_accounting_keeps_without_its_comment_is_taken_as_this_task_s():
    """Slurm stores job comments in accounting only with AccountingStoreFlags=job_comment: an ended job only sacct
    reports has none, and counts (it is only read); a live one is always in squeue, with its comment."""
    ended = job("41", name(1), JobState.ERROR, "FAILED", comment=None, source="sacct")
    hook = HookDouble(existing=[ended], submit_outcomes=[SubmitResult(job_id="42", cluster=None)])
    trigger = run_execute(make_op(hook), context(try_number=2))
    assert trigger.handle.retry_of == "41"


def test_the_submission_carries_this_try_s_owner_proof(monkeypatch):
    from npa_airflow.common.deployment import current_deployment

    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="101", cluster=None)])
    ctx = context()
    run_execute(make_op(hook), ctx)
    comment = next(c for c in hook.calls if c[0] == "submit")[3]["owner_comment"]
    assert comment == current_deployment().owner_comment(name(1), ctx["ti"].id)
    assert str(ctx["ti"].id) in comment


@pytest.mark.parametrize(("submitted", "adopted"), [(50.0, True), (150.0, False), (None, False)])
def test_a_job_under_the_previous_release_s_name_is_found_once_after_the_upgrade(monkeypatch, submitted, adopted):
    """Submitted before this deployment's identity existed (the upgrade at t=100): the next try reattaches to it. One
    submitted after it is another deployment's, still on the previous release."""
    from npa_airflow.common import deployment as d

    monkeypatch.setattr(d, "current_deployment", lambda: d.Deployment("npa-test-deployment-key-0001", 100.0, "test"))
    old = job("41", legacy_name(1), JobState.RUNNING, comment=None, source="squeue", submitted_at=submitted)
    hook = HookDouble(existing=[old], submit_outcomes=[SubmitResult(job_id="42", cluster=None)])
    trigger = run_execute(make_op(hook), context(try_number=2))
    assert trigger.handle.job_id == ("41" if adopted else "42")
    if adopted:
        assert trigger.handle.job_name == legacy_name(1)
        assert trigger.handle.script_path == f"/shared/results/sbatch/{legacy_name(1)}.sbatch"
        assert trigger.handle.submitted_at == submitted
    assert not [c for c in hook.calls if c[0] == "cancel"]


def test_live_job_of_earlier_try_is_cancelled_by_option():
    hook = HookDouble(
        existing=[job("41", name(1), JobState.RUNNING)],
        submit_outcomes=[SubmitResult(job_id="42", cluster=None)],
    )
    trigger = run_execute(make_op(hook, on_previous_try="cancel"), context(try_number=2))
    assert ("cancel", "41") in hook.calls
    assert trigger.handle.job_id == "42" and trigger.handle.retry_of == "41"


def test_ambiguous_submission_adopts_the_one_job_that_exists():
    hook = HookDouble(
        submit_outcomes=[NpaAmbiguousSubmission("connection lost during submission")],
        appear_after_ambiguous=[job("77", name(1), JobState.PENDING)],
    )
    trigger = run_execute(make_op(hook), context())
    assert trigger.handle.job_id == "77"
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
    assert trigger.handle.job_id == "90"
    assert len([c for c in hook.calls if c[0] == "submit"]) == 2


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

    op.this_try(context()).handle = SlurmJobHandle.from_dict(handle_dict())
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


def test_cancel_option_never_cancels_for_a_submission_with_missing_inputs():
    hook = HookDouble(existing=[job("41", name(1), JobState.RUNNING)])
    hook.paths_exist = lambda paths: {p: False for p in paths}
    op = make_op(hook, on_previous_try="cancel", inputs=["lustre:///data/missing"])
    op.render_template_fields(context(try_number=2))
    with pytest.raises(
        NpaValidationError,
        match=r"required inputs do not exist on the cluster \(checked with test -e\): /data/missing\.",
    ):
        op.execute(context(try_number=2))  # refused by the read-only checks, before earlier tries are looked at
    assert not [c for c in hook.calls if c[0] in ("cancel", "submit")]


def test_read_only_queries_ride_out_a_short_controller_outage(monkeypatch):
    from npa_airflow.exceptions import NpaHostKeyError, NpaRemoteError

    monkeypatch.setattr("npa_airflow.common.retry.pause", lambda s: None)
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
    monkeypatch.setattr(outage, "OUTAGE_RETRY_SECONDS", 0.0)

    def down():
        raise NpaRemoteError("slurm_load_partitions error: Unable to contact slurm controller")

    with pytest.raises(NpaRemoteError):  # bounded: the task fails (and may retry) instead of waiting forever
        op.cluster_read("reading partitions", down)


def node_fail_event():
    return make_event_payload(
        "failed", handle_dict(), "Slurm job 101 ended NODE_FAIL", state="ERROR", native_state="NODE_FAIL",
        exit_code=0, signal=None, node_list="c1", reason=None, log_tail="",
    )  # fmt: skip


def test_bad_nodes_live_with_the_task_instance_and_are_forgotten_on_success():
    store = TaskStateStoreDouble()  # one store for every try of the task instance
    with pytest.raises(AirflowException, match="the next try excludes c1"):
        make_op(HookDouble()).execute_complete(context(task_state_store=store), node_fail_event())
    assert store.values == {BAD_NODES_KEY: ["c1"]}

    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="102", cluster=None)])
    retry = make_op(hook)
    ctx = context(try_number=2, task_state_store=store)
    run_execute(retry, ctx)
    assert "#SBATCH --exclude=c1" in retry.sbatch_script  # what was submitted

    success = make_event_payload("success", {**handle_dict("102"), "job_name": name(2)}, "done")
    retry.execute_complete(ctx, success)
    assert store.values == {}


def test_carried_nodes_that_no_longer_exist_are_not_excluded():
    store = TaskStateStoreDouble()
    store.set(BAD_NODES_KEY, ["c9", "c2"])
    op = make_op(HookDouble(submit_outcomes=[SubmitResult(job_id="103", cluster=None)]))
    run_execute(op, context(try_number=2, task_state_store=store))
    assert [ln for ln in op.sbatch_script.splitlines() if "--exclude" in ln] == ["#SBATCH --exclude=c2"]


def test_without_a_task_state_store_nothing_is_carried():
    with pytest.raises(AirflowException, match=r"NODE_FAIL[^;]*\)\. ---"):
        make_op(HookDouble()).execute_complete(context(), node_fail_event())


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"nodes": 4096}, "nodes=4096 but partition 'cpu' has 2 node(s)"),
        ({"gpus_per_node": 4}, "at most 0 GPU(s) per node (Gres)"),
        ({"extra_sbatch": ["--mem=64G"]}, "65536 MB of memory"),
        ({"inputs": ["lustre:///data/missing"]}, "do not exist on the cluster (checked with test -e): /data/missing"),
    ],
)
def test_hopeless_requests_are_refused_before_anything_is_written(kwargs, says):
    hook = HookDouble(missing_paths={"/data/missing"})
    op = make_op(hook, **kwargs)
    op.render_template_fields(context())
    with pytest.raises(NpaValidationError) as err:
        op.execute(context())
    assert says in str(err.value)
    assert not [call for call in hook.calls if call[0] in ("submit", "find", "cancel")]


def test_an_unsatisfiable_job_is_cancelled_and_fails_with_slurms_reason():
    hook = HookDouble()
    op = make_op(hook)
    event = make_event_payload(
        "unsatisfiable", handle_dict(), "Slurm job 101 can never start: it is PENDING with Reason=BadConstraints",
        reason="BadConstraints", native_state="PENDING", state="PENDING",
    )  # fmt: skip
    with pytest.raises(AirflowFailException, match=r"Reason=BadConstraints.*cancelled.*--constraint"):
        op.execute_complete(context(), event)
    assert ("cancel", "101") in hook.calls


# -- lifecycle edges: kills in flight, failed cancels, max_wait across reattach, cancels outside Airflow -------


def test_a_kill_while_sbatch_runs_cancels_this_tries_job_by_name_and_stops_the_submission():
    hook = HookDouble(submit_outcomes=[SubmitResult(job_id="101", cluster=None)])
    op = make_op(hook)
    submit = hook.stage_and_submit

    def killed_meanwhile(files, script_path, **kwargs):
        result = submit(files, script_path, **kwargs)
        op.on_kill()  # Airflow's SIGTERM handler runs while sbatch is in flight
        return result

    hook.stage_and_submit = killed_meanwhile
    op.render_template_fields(context())
    with pytest.raises(AirflowException, match="killed while its Slurm job was being submitted; it was cancelled"):
        op.execute(context())
    marker = f"/shared/results/sbatch/{name(1)}.sbatch.npa-cancelled"
    assert ("cancel_by_name", name(1), marker) in hook.calls  # this try's exact name, nothing broader
    assert hook.cancel_by_name_comments == [next(c for c in hook.calls if c[0] == "submit")[3]["owner_comment"]]
    assert ("cancel", "101") in hook.calls  # and the id sbatch returned once the process resumed
    assert next(c for c in hook.calls if c[0] == "submit")[3]["job_name"] == name(1)  # the login host honours it


def test_a_kill_during_reconciliation_stops_it_after_cancelling_by_name():
    hook = HookDouble(submit_outcomes=[NpaAmbiguousSubmission("connection lost")])
    op = make_op(hook)
    find, lookups = hook.find_jobs_by_name, []

    def killed_while_looking(names):
        lookups.append(names)
        if len(lookups) == 2:  # the reconciliation's first lookup (the first one looks for earlier tries)
            op.on_kill()
        return find(names)

    hook.find_jobs_by_name = killed_while_looking
    op.render_template_fields(context())
    with pytest.raises(AirflowException, match=r"killed while its Slurm job was being submitted$"):
        op.execute(context())
    assert [c[:2] for c in hook.calls if c[0].startswith("cancel")] == [("cancel_by_name", name(1))]
    assert len([c for c in hook.calls if c[0] == "submit"]) == 1  # never submitted again


def test_on_kill_before_anything_is_in_flight_does_nothing():
    hook = HookDouble()
    make_op(hook).on_kill()
    assert hook.calls == []


def test_a_deadline_cancel_that_fails_is_reported_and_leaves_the_task_retryable(monkeypatch):
    from npa_airflow.exceptions import NpaCancelFailed

    hook = HookDouble()

    def refuse(request):
        raise NpaCancelFailed("nothing was cancelled: slurmctld does not know Slurm job 101")

    hook.cancel_one = refuse
    op = make_op(hook)
    with pytest.raises(AirflowException) as err:
        op.execute_complete(context(), make_event_payload("deadline", handle_dict(), "late"))
    assert not isinstance(err.value, AirflowFailException)
    assert "could NOT be cancelled (nothing was cancelled" in str(err.value) and "it was cancelled" not in str(
        err.value
    )


def test_an_unanswered_cancel_is_retried_before_it_counts_as_failed(monkeypatch):
    from npa_airflow.exceptions import NpaRemoteError

    monkeypatch.setattr("npa_airflow.common.retry.pause", lambda s: None)
    hook = HookDouble()
    answers = [NpaRemoteError("Unable to contact slurm controller"), "cancelled"]

    def flaky(request):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    hook.cancel_one = flaky
    with pytest.raises(AirflowException, match=r"deadline .*; it was cancelled$"):
        make_op(hook).execute_complete(context(), make_event_payload("deadline", handle_dict(), "late"))
    assert answers == []


def test_a_reattached_job_keeps_slurms_submit_time_for_its_deadline():
    hook = HookDouble(existing=[job("41", name(1), JobState.RUNNING)], submit_times={"41": 1_796_216_400.0})
    op = make_op(hook, max_wait=timedelta(minutes=30))
    trigger = run_execute(op, context(try_number=2))
    assert trigger.handle.submitted_at == 1_796_216_400.0
    assert trigger.deadline == 1_796_216_400.0 + 1800


def test_an_earlier_try_job_cancelled_outside_airflow_is_not_resubmitted():
    hook = HookDouble(
        existing=[job("41", name(1), JobState.CANCELED)], submit_outcomes=[SubmitResult(job_id="42", cluster=None)]
    )
    op = make_op(hook)
    op.render_template_fields(context(try_number=2))
    with pytest.raises(AirflowFailException, match=r"Slurm job 41 \(.*-t1\) of an earlier try was cancelled outside "
                       r"Airflow by uid 0 \(root\); it is not submitted again"):  # fmt: skip
        op.execute(context(try_number=2))
    assert not [c for c in hook.calls if c[0] == "submit"]
    assert [c for c in hook.calls if c[0] == "run"]  # reported: a clear of the task now runs it again


def test_an_earlier_try_job_airflow_cancelled_is_replaced():
    hook = HookDouble(
        existing=[job("41", name(1), JobState.CANCELED)], submit_outcomes=[SubmitResult(job_id="42", cluster=None)]
    )
    hook.cancelled_by_airflow.add("41")
    trigger = run_execute(make_op(hook), context(try_number=2))
    assert trigger.handle.job_id == "42" and trigger.handle.retry_of == "41"


def canceled_event(job_id: str = "41") -> dict:
    return make_event_payload(
        "canceled", {**handle_dict(job_id), "try_number": 1}, f"Slurm job {job_id} ended CANCELLED",
        state="CANCELED", native_state="CANCELLED",
    )  # fmt: skip


def test_a_reattached_job_cancelled_outside_airflow_fails_naming_who():
    hook = HookDouble()
    op = make_op(hook)
    with pytest.raises(AirflowFailException, match=r"cancelled outside Airflow by uid 0 \(root\)"):
        op.execute_complete(context(try_number=2), canceled_event())
    assert not [c for c in hook.calls if c[0] == "submit"]


def test_a_reattached_job_airflow_cancelled_for_a_clear_is_run_again():
    hook = HookDouble(
        existing=[job("41", name(1), JobState.CANCELED)], submit_outcomes=[SubmitResult(job_id="42", cluster=None)]
    )
    hook.cancelled_by_airflow.add("41")
    op = make_op(hook)
    op.render_template_fields(context(try_number=2))
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context(try_number=2), canceled_event())
    assert deferred.value.trigger.handle.job_id == "42"
