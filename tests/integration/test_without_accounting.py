"""A Slurm site without accounting (no slurmdbd), on the real bed without it (`dev/cluster --no-accounting`), over
real SSH: sacct answers "Slurm accounting storage is disabled" there, and the provider waits, streams, settles,
reconciles and cancels from squeue, `scontrol show job` and each job's end record.

Runs only on that bed: `NPA_SLURM_ACCOUNTING=none dev/test tests/integration/test_without_accounting.py`. Its
MinJobAge is short (30 s, `NPA_SLURM_MIN_JOB_AGE`), so a job can outlive slurmctld's record of it within a test.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.transport.async_hook import AsyncSlurmHook
from npa_airflow.slurm.transport.cancels import cancel_marker_of
from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import collecting_logger, submit_deferred, task_context
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = [pytest.mark.integration, pytest.mark.no_accounting]


class Commands:
    """Every remote command the hooks send, while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[str] = []
        # The base class: the operator's SlurmHook and the channel's AsyncSlurmHook (the poller's, the kill batch's).
        original = AsyncSlurmHook.arun
        sent = self.sent

        async def arun(hook: AsyncSlurmHook, argv: Any, **kwargs: Any) -> Any:
            sent.append(argv if isinstance(argv, str) else " ".join(argv))
            return await original(hook, argv, **kwargs)

        monkeypatch.setattr(AsyncSlurmHook, "arun", arun)

    def sacct(self) -> list[str]:
        return [c for c in self.sent if "sacct " in c]


def run_trigger(trigger: Any, timeout: float = 180) -> tuple[dict, list[str]]:
    """The trigger's event and the lines it logged, on a fresh event loop (a triggerer's)."""
    from npa_airflow.slurm.triggers import SlurmJobTrigger

    reset_pollers()
    watcher = SlurmJobTrigger(**trigger.serialize()[1])
    watcher._log, collected = collecting_logger("noacct")

    async def wait() -> dict:
        return (await asyncio.wait_for(anext(watcher.run()), timeout)).payload

    return asyncio.run(wait()), collected.lines


def squeue_knows(cluster_ssh: Any, job_id: str) -> bool:
    return bool(cluster_ssh(f"squeue -h -t all -o %i --jobs={job_id}").stdout.strip())


def wait_until_forgotten(cluster_ssh: Any, job_ids: list[str], min_job_age: int) -> float:
    """Seconds until slurmctld forgot every job (MinJobAge after its end, at its next purge)."""
    start = time.monotonic()
    deadline = start + min_job_age + 180
    while any(squeue_knows(cluster_ssh, j) for j in job_ids):
        assert time.monotonic() < deadline, f"slurmctld still knows {job_ids} after {deadline - start:.0f} s"
        time.sleep(3)
    return time.monotonic() - start


def test_the_bed_has_no_accounting(slurm_cluster, cluster_ssh):
    result = cluster_ssh("sacct -X -n -o JobID -S now")
    assert result.returncode == 1 and "Slurm accounting storage is disabled" in result.stderr
    assert not slurm_cluster.accounting and slurm_cluster.cluster2 == ""


def test_preflight_reports_that_the_cluster_keeps_no_accounting(slurm_cluster, monkeypatch):
    from npa_airflow.slurm.operators import SlurmPreflightOperator

    op = SlurmPreflightOperator(task_id="preflight", partitions=["cpu"], time_hours=1)
    logger, collected = collecting_logger("preflight")
    monkeypatch.setattr(type(op), "log", property(lambda self: logger))
    report = op.execute(task_context(f"npa_itest_noacct_pf_{uuid.uuid4().hex[:6]}", task_id="preflight"))
    assert report["ok"] and report["accounting"] is False
    assert any("no accounting (no slurmdbd)" in line for line in collected.lines), collected.lines


def test_a_job_completes_with_its_log_and_no_sacct_after_the_first(slurm_cluster, monkeypatch):
    op = make_operator(command="echo noacct-line-1; sleep 1; echo noacct-line-2")
    ctx = task_context(f"npa_itest_noacct_ok_{uuid.uuid4().hex[:6]}")
    trigger = submit_deferred(op, ctx)
    commands = Commands(monkeypatch)
    payload, lines = run_trigger(trigger)
    assert payload["status"] == "success", payload
    assert [x for x in lines if x.startswith("noacct-line-")] == ["noacct-line-1", "noacct-line-2"]
    assert len(commands.sacct()) <= 1, "sacct runs once per connection, to learn there is no accounting"
    assert op.execute_complete(ctx, payload)["job_id"] == trigger.handle.job_id


def test_gpu_usage_is_unknown_and_said_so_never_made_up(slurm_cluster, monkeypatch):
    """No slurmdbd, no record of what a job was allocated or how long it ran: XCom npa_usage is None and the task
    log says why."""
    op = make_operator(command="sleep 2; echo noacct-usage", partition="gpu", gpus_per_node=8)
    ctx = task_context(f"npa_itest_noacct_usage_{uuid.uuid4().hex[:6]}")
    payload, _ = run_trigger(submit_deferred(op, ctx))
    assert payload["status"] == "success", payload
    assert (payload["usage"], payload["usage_unknown"]) == (None, "the cluster keeps no accounting")
    logger, collected = collecting_logger("noacct-usage")
    monkeypatch.setattr(type(op), "log", property(lambda self: logger))
    op.execute_complete(ctx, payload)
    assert "npa_usage" in ctx["ti"].pushed and ctx["ti"].pushed["npa_usage"] is None
    assert collected.lines[-1] == "GPU usage: unknown (the cluster keeps no accounting)"


def test_a_failing_program_fails_with_its_exit_code_and_log_tail(slurm_cluster):
    from airflow.sdk.exceptions import AirflowFailException

    op = make_operator(command='echo "fatal: no accounting here" >&2; exit 3')
    ctx = task_context(f"npa_itest_noacct_fail_{uuid.uuid4().hex[:6]}")
    payload, _ = run_trigger(submit_deferred(op, ctx))
    assert payload["status"] == "failed" and payload["native_state"] == "FAILED" and payload["exit_code"] == 3
    with pytest.raises(AirflowFailException, match=r"(?s)exit code 3.*fatal: no accounting here"):
        op.execute_complete(ctx, payload)


def test_jobs_that_ended_longer_than_min_job_age_ago_are_settled_from_their_end_records(slurm_cluster, cluster_ssh):
    """A triggerer that comes back after slurmctld forgot the jobs (MinJobAge) still settles each one right:
    exit 0 is a success (with its whole log), exit 4 a failure with its code, and a job that ended before its
    script's last write (cancelled here, outside Airflow) a failure saying so, never a success."""
    from airflow.sdk.exceptions import AirflowFailException

    ok_op = make_operator(command="echo before-purge-1; echo before-purge-2")
    ok_ctx = task_context(f"npa_itest_noacct_aged_ok_{uuid.uuid4().hex[:6]}")
    ok = submit_deferred(ok_op, ok_ctx)
    bad_op = make_operator(command="echo failing late; exit 4")
    bad_ctx = task_context(f"npa_itest_noacct_aged_bad_{uuid.uuid4().hex[:6]}")
    bad = submit_deferred(bad_op, bad_ctx)
    gone = submit_deferred(
        make_operator(command="sleep 300"), task_context(f"npa_itest_noacct_aged_cx_{uuid.uuid4().hex[:6]}")
    )
    ids = [t.handle.job_id for t in (ok, bad, gone)]
    deadline = time.monotonic() + 60
    while "RUNNING" not in cluster_ssh(f"squeue -h -t all -o %T --jobs={ids[2]}").stdout:
        assert time.monotonic() < deadline, "the long job never started"
        time.sleep(1)
    cluster_ssh(f"scancel {ids[2]}", check=True)
    forgotten_after = wait_until_forgotten(cluster_ssh, ids, slurm_cluster.min_job_age)
    print(f"slurmctld forgot the jobs {forgotten_after:.0f} s after they ended (MinJobAge {slurm_cluster.min_job_age})")

    payload, lines = run_trigger(ok)
    assert payload["status"] == "success", payload
    assert [x for x in lines if x.startswith("before-purge-")] == ["before-purge-1", "before-purge-2"]
    assert ok_op.execute_complete(ok_ctx, payload)["job_id"] == ids[0]

    payload, _ = run_trigger(bad)
    assert (payload["status"], payload["native_state"], payload["exit_code"]) == ("failed", "FAILED", 4)
    with pytest.raises(AirflowFailException, match="exit code 4"):
        bad_op.execute_complete(bad_ctx, payload)

    payload, _ = run_trigger(gone)
    # scancel's SIGTERM may reach the script before its last write (no record: how it ended is unknown) or let it
    # write the child's 143 first; a failure either way, never a success
    assert payload["status"] == "failed" and payload["exit_code"] in (None, 143), payload
    if payload["exit_code"] is None:
        assert "no end record" in payload["message"] and "keeps no accounting" in payload["message"]


def test_on_kill_cancels_the_job_and_the_cancel_is_airflows(slurm_cluster, cluster_ssh, monkeypatch):
    reset_pollers()
    install_supervisor(monkeypatch, "failed")  # the user marked the task failed
    op = make_operator(command="sleep 120")
    trigger = run_for_task_instance(submit_deferred(op, task_context(f"npa_itest_noacct_kill_{uuid.uuid4().hex[:6]}")))
    job_id = trigger.handle.job_id

    async def scenario() -> None:
        deadline = time.monotonic() + 60
        hook = SlurmHook("slurm_default")
        while (await hook.ajob_states([job_id]))[job_id].native_state != "RUNNING":
            assert time.monotonic() < deadline
            await asyncio.sleep(1)
        run = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.sleep(3)
        run.cancel()  # the triggerer cancels the trigger for a user action, then calls on_kill
        await trigger.on_kill()

    asyncio.run(scenario())
    assert cluster_ssh(f"squeue -h -t all -o %T --jobs={job_id}", check=True).stdout.strip() == "CANCELLED"
    marker = cancel_marker_of(trigger.handle.script_path)
    origin = SlurmHook("slurm_default").cancel_origin(job_id, marker)
    assert origin.by_airflow and not origin.accounting


def test_a_cancel_outside_airflow_fails_the_task_saying_who_cannot_be_told(slurm_cluster, cluster_ssh):
    from airflow.sdk.exceptions import AirflowFailException

    op = make_operator(command="sleep 120")
    ctx = task_context(f"npa_itest_noacct_outside_{uuid.uuid4().hex[:6]}")
    trigger = submit_deferred(op, ctx)
    job_id = trigger.handle.job_id
    deadline = time.monotonic() + 60
    while "RUNNING" not in cluster_ssh(f"squeue -h -t all -o %T --jobs={job_id}").stdout:
        assert time.monotonic() < deadline
        time.sleep(1)
    cluster_ssh(f"scancel {job_id}", check=True)
    payload, _ = run_trigger(trigger)
    assert payload["status"] == "canceled"
    with pytest.raises(AirflowFailException, match=r"outside Airflow.*keeps no accounting"):
        op.execute_complete(ctx, payload)


def test_cancel_of_a_job_slurmctld_forgot_is_told_by_its_end_record(slurm_cluster, cluster_ssh):
    """A cancel that comes after the job ended and slurmctld forgot it: ENDED where its script wrote its end
    record; refused (never "cancelled") where it left none, since no accounting can tell."""
    from npa_airflow.exceptions import NpaCancelFailed
    from npa_airflow.slurm.handle import end_record_for

    done = submit_deferred(make_operator(command="true"), task_context(f"npa_itest_noacct_cx_{uuid.uuid4().hex[:6]}"))
    handle = done.handle.to_dict()
    wait_until_forgotten(cluster_ssh, [handle["job_id"]], slurm_cluster.min_job_age)
    hook = SlurmHook("slurm_default")
    record = end_record_for(handle["results_dir"])
    kwargs = {"job_name": handle["job_name"], "end_record": record}
    assert hook.cancel(handle["job_id"], **kwargs) == "ended"
    cluster_ssh(f"rm -f {record}", check=True)
    with pytest.raises(NpaCancelFailed, match="keeps no accounting"):
        hook.cancel(handle["job_id"], **kwargs)


def test_an_ambiguous_submission_is_reconciled_by_name_from_squeue(slurm_cluster, cluster_ssh, monkeypatch):
    """The SSH session dies right after sbatch ran: the job is found by its exact name and owner proof in squeue
    (no sacct to ask), and adopted: one job."""
    drops = []
    original = SlurmHook.arun

    async def arun_dropping_after_sbatch(self, argv, **kwargs):
        if isinstance(argv, str) and "sbatch --parsable" in argv and not drops:
            drops.append(argv)
            argv = argv + "\nkill -KILL $PPID"  # the sshd session dies after sbatch printed its id
        return await original(self, argv, **kwargs)

    monkeypatch.setattr(SlurmHook, "arun", arun_dropping_after_sbatch)
    trigger = submit_deferred(
        make_operator(command="echo adopted"), task_context(f"npa_itest_noacct_ambig_{uuid.uuid4().hex[:6]}")
    )
    assert drops, "the drop was not injected"
    time.sleep(2)
    named = cluster_ssh(f"squeue -h -t all -o %i --name={trigger.handle.job_name}", check=True).stdout.split()
    assert named == [trigger.handle.job_id]


def test_a_retry_reattaches_to_the_live_job_of_the_earlier_try_found_by_name(slurm_cluster, cluster_ssh):
    dag_id = f"npa_itest_noacct_reattach_{uuid.uuid4().hex[:6]}"
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    first = submit_deferred(make_operator(command="sleep 60"), task_context(dag_id, try_number=1, run_id=run_id))
    second = submit_deferred(make_operator(command="sleep 60"), task_context(dag_id, try_number=2, run_id=run_id))
    assert second.handle.job_id == first.handle.job_id  # reattached: no second job
    cluster_ssh(f"scancel {first.handle.job_id}", check=True)
