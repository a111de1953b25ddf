"""Refused fast and named right, on the real local cluster: a missing input next to a large staged file, a
request no partition can hold, and a job pending on a reason that never clears."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaValidationError
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.submit.staging import StagedFile
from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.harness.airflow_tasks import task_context
from tests.harness.slurm_accounting import accounted_jobs, sacct_jobs

pytestmark = pytest.mark.integration


@pytest.fixture
def workdir(slurm_cluster) -> str:
    return f"{slurm_cluster.shared}/tests/refusals-{uuid.uuid4().hex[:10]}"


async def test_missing_input_beside_a_large_file_is_refused_in_seconds_every_time(slurm_cluster, workdir):
    """The script exits on `test -e` while 8 MB of stdin are still on their way: never ambiguous, never 100 s."""
    hook = SlurmHook("slurm_default")
    for attempt in range(5):  # the race was intermittent: one pass proves little
        script = f"{workdir}/{attempt}/job.sbatch"
        files = [StagedFile(f"{workdir}/{attempt}/big.bin", os.urandom(8 << 20)), StagedFile(script, b"#!/bin/bash\n")]
        started = time.monotonic()
        with pytest.raises(NpaValidationError, match="required inputs do not exist") as err:
            await hook.astage_and_submit(
                files,
                script,
                sbatch_args=["--partition=cpu", f"--job-name=npa-refusal-{attempt}", "--time=1"],
                required_paths=[f"{workdir}/no-such-input"],
            )
        assert not isinstance(err.value, NpaAmbiguousSubmission)
        assert time.monotonic() - started < 20
        assert not await hook.apath_exists(f"{workdir}/{attempt}")


def test_operator_refuses_a_missing_input_before_writing_or_submitting(slurm_cluster, cluster_ssh):
    op = make_operator(command="true", inputs=[f"lustre://{slurm_cluster.shared}/data/no-such-{uuid.uuid4().hex[:6]}"])
    ctx = task_context(f"npa_itest_missing_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    started = time.monotonic()
    with pytest.raises(NpaValidationError, match="required inputs do not exist") as err:
        op.execute(ctx)
    assert not isinstance(err.value, NpaAmbiguousSubmission)
    assert time.monotonic() - started < 20
    time.sleep(2)
    assert sacct_jobs(cluster_ssh, op.job_name_for_context(ctx)) == []


def test_nodes_4096_are_refused_before_submit(slurm_cluster, cluster_ssh):
    op = make_operator(command="true", nodes=4096)
    ctx = task_context(f"npa_itest_nodes_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    with pytest.raises(NpaValidationError, match=r"nodes=4096 but partition 'cpu' has 2 node\(s\)"):
        op.execute(ctx)
    time.sleep(2)
    assert sacct_jobs(cluster_ssh, op.job_name_for_context(ctx)) == []


def test_gpus_on_a_partition_without_gpus_are_refused_before_submit(slurm_cluster, cluster_ssh):
    op = make_operator(command="true", gpus_per_node=1)
    ctx = task_context(f"npa_itest_gres_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    with pytest.raises(NpaValidationError, match=r"at most 0 GPU\(s\) per node"):
        op.execute(ctx)
    assert sacct_jobs(cluster_ssh, op.job_name_for_context(ctx)) == []


async def _failed_job(slurm_cluster) -> str:
    hook = SlurmHook("slurm_default")
    workdir = f"{slurm_cluster.shared}/tests/refusals-{uuid.uuid4().hex[:10]}"
    script = f"{workdir}/fail.sbatch"
    result = await hook.astage_and_submit(
        [StagedFile(script, b"#!/bin/bash\nexit 1\n", 0o700)],
        script,
        sbatch_args=["--partition=cpu", f"--output={workdir}/%j.out", "--time=1"],
    )
    for _ in range(90):
        info = (await hook.ajob_states([result.job_id])).get(result.job_id)
        if info is not None and info.state.is_terminal:
            return result.job_id
        await asyncio.sleep(1)
    raise AssertionError(f"job {result.job_id} did not end")


def test_a_job_pending_on_a_never_clearing_reason_fails_fast_and_is_cancelled(slurm_cluster, cluster_ssh):
    """afterok on a job that failed: Slurm keeps it PENDING (DependencyNeverSatisfied) until its deadline."""
    from airflow.sdk.exceptions import AirflowFailException

    reset_pollers()
    failed = asyncio.run(_failed_job(slurm_cluster))
    op = make_operator(command="true", extra_sbatch=[f"--dependency=afterok:{failed}"], deferrable=False)
    ctx = task_context(f"npa_itest_never_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    started = time.monotonic()
    with pytest.raises(AirflowFailException, match=r"Reason=DependencyNeverSatisfied.*cancelled"):
        op.execute(ctx)
    assert time.monotonic() - started < 120
    # By id: a job cancelled while waiting on a dependency was never eligible, and sacct's time window
    # (--starttime) leaves such jobs out.
    job_id = op.linked_job()["job_id"]
    state = poll_state(cluster_ssh, job_id, accounting=slurm_cluster.accounting)
    assert state.startswith("CANCELLED"), state


def test_the_task_log_says_why_a_job_is_pending(slurm_cluster, cluster_ssh):
    """A held job: the trigger's PENDING line carries slurmctld's reason (24.11's sacct has none, 22.05's is
    often None too), and only one squeue per cycle asks about it."""
    from npa_airflow.slurm.transport.async_hook import AsyncSlurmHook  # the hook of the poller's channel
    from tests.harness.airflow_tasks import collecting_logger, submit_deferred

    reset_pollers()
    op = make_operator(command="true", extra_sbatch=["--hold"])
    trigger = submit_deferred(op, task_context(f"npa_itest_held_{uuid.uuid4().hex[:6]}"))
    trigger._log, collected = collecting_logger("held")
    job_id = trigger.handle.job_id
    commands: list[str] = []
    arun = AsyncSlurmHook.arun

    async def counting(self, argv, **kwargs):
        commands.append(argv if isinstance(argv, str) else " ".join(argv))
        return await arun(self, argv, **kwargs)

    async def until_reason() -> None:
        events = trigger.run()
        waiting = asyncio.ensure_future(events.__anext__())
        deadline = time.monotonic() + 60
        while not any("reason JobHeldUser" in line for line in collected.lines):
            assert not waiting.done(), waiting.result()
            assert time.monotonic() < deadline, collected.lines
            await asyncio.sleep(0.2)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await events.aclose()

    AsyncSlurmHook.arun = counting  # type: ignore[method-assign]
    try:
        asyncio.run(until_reason())
    finally:
        AsyncSlurmHook.arun = arun  # type: ignore[method-assign]
        cluster_ssh(f"scancel {job_id}")
    assert f"Slurm job {job_id} is PENDING (PENDING, reason JobHeldUser)" in collected.lines
    if not slurm_cluster.accounting:  # no sacct after the one that taught the hook: one squeue per cycle
        state_queries = [c for c in commands if "squeue " in c and "--jobs=" in c]
        assert state_queries and all("sacct" not in c for c in state_queries[1:]), state_queries
        return
    state_queries = [c for c in commands if "sacct" in c and "--jobs=" in c]
    assert state_queries and all(c.count("squeue ") == 1 for c in state_queries), "squeue rides with the sacct"


def poll_state(cluster_ssh, job_id: str, timeout: float = 30, accounting: bool = True) -> str:
    """The job's state as sacct records it, waiting out accounting lag (slurmctld's without accounting)."""
    deadline = time.monotonic() + timeout
    ask = f"sacct -X -n -P -j {job_id} -o State" if accounting else f"squeue -h -t all -o %T --jobs={job_id}"
    while True:
        state = cluster_ssh(ask, check=True).stdout.strip()
        if state or time.monotonic() > deadline:
            return state
        time.sleep(1)


def test_a_constraint_no_node_offers_fails_fast_with_slurms_reason(slurm_cluster, cluster_ssh):
    """slurmctld either refuses the feature at submit ("Invalid feature specification") or keeps the job
    PENDING on BadConstraints: either way the task fails in seconds and no job is left waiting."""
    from airflow.sdk.exceptions import AirflowFailException

    from npa_airflow.exceptions import NpaRemoteError

    reset_pollers()
    op = make_operator(command="true", extra_sbatch=["--constraint=nosuchfeature"], deferrable=False)
    ctx = task_context(f"npa_itest_feature_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    started = time.monotonic()
    with pytest.raises((AirflowFailException, NpaRemoteError)) as err:
        op.execute(ctx)
    assert time.monotonic() - started < 120
    assert any(word in str(err.value) for word in ("feature", "BadConstraints")), str(err.value)
    if isinstance(err.value, AirflowFailException):
        (job,) = accounted_jobs(cluster_ssh, op.job_name_for_context(ctx))
        assert job["state"].startswith("CANCELLED")
    else:
        assert sacct_jobs(cluster_ssh, op.job_name_for_context(ctx)) == []
