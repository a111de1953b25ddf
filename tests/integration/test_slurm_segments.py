"""Long runs on the real local cluster: segments continued through NPA_CONTINUE_FILE, the limits of that contract,
and preemption (the bed's urgent partition preempts the gpu one: PreemptMode=REQUEUE, GraceTime=10,
preempt_send_user_signal; dev/cluster.d/slurm.conf.in).

The commands are a training loop's stand-in: they count steps, one line per step in steps.log and the last step in a
checkpoint file, both in the run's results dir, so the test can tell a lost step from a repeated one.
"""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.common.naming import segment_job_name
from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import collecting_logger, task_context
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.harness.slurm_accounting import accounted_jobs

pytestmark = pytest.mark.integration

# 40 steps a segment, then idle until Slurm's warning: checkpoint, ask for the next segment, and exit (segment 2
# stays until the time limit ends it, TIMEOUT). Segment 3 reaches step 100 and ends the run.
COUNTER = """\
ckpt="${NPA_RESULTS_DIR}/ckpt" steps="${NPA_RESULTS_DIR}/steps.log"
step=$(cat "$ckpt" 2>/dev/null || echo 0)
echo "npa-test: segment ${NPA_SEGMENT} of ${NPA_MAX_SEGMENTS} resumes at step $step"
on_warning() {
  echo "step $step" > "$NPA_CONTINUE_FILE"
  echo "npa-test: warned at step $step"
  [ "$NPA_SEGMENT" = 2 ] || exit 0
}
trap on_warning USR1
budget=$((step + 40))
while [ "$step" -lt "$budget" ] && [ "$step" -lt 100 ]; do
  step=$((step + 1)); echo "$step" >> "$steps"; echo "$step" > "$ckpt"
done
[ "$step" -lt 100 ] || { echo "npa-test: done at step $step"; exit 0; }
while :; do sleep 300 & wait || true; done"""


def segment_states(cluster_ssh, first: str, count: int, timeout: float = 30) -> dict[str, str]:
    """{job name: state} of the run's segments as accounting records them, once it has all `count` (it lags)."""
    deadline = time.monotonic() + timeout
    while True:
        states = {j["name"]: j["state"] for j in accounted_jobs(cluster_ssh, first.rpartition("-t")[0])}
        if len(states) >= count or time.monotonic() > deadline:
            return states
        time.sleep(1)


def run_operator(op, ctx):
    op.render_template_fields(ctx)
    return op.execute(ctx)  # deferrable=False: every segment's wait runs here, in order


def read(cluster_ssh, path: str) -> str:
    return cluster_ssh(f"cat {path}", check=True).stdout


@pytest.fixture
def logged(monkeypatch):
    """A fresh logger for the operator class; its lines."""

    def attach(op):
        logger, collected = collecting_logger(f"segments-{uuid.uuid4().hex[:6]}")
        monkeypatch.setattr(type(op), "log", property(lambda self: logger))
        return collected.lines

    return attach


def test_three_segments_count_every_step_once_in_one_try_and_one_results_dir(slurm_cluster, cluster_ssh, logged):
    reset_pollers()
    # The child timeout, 45 s into the minute, ends segment 2 (it stays past the warning). Slurm sends the warning
    # from its periodic check: asked for 50 s before the limit, it came 10 to 30 s into the job on both releases.
    op = make_operator(
        command=COUNTER,
        time_hours=1 / 60,
        timeout_hours=45 / 3600,
        checkpoint_signal="USR1@50",
        max_segments=3,
        deferrable=False,
    )
    lines = logged(op)
    ctx = task_context(f"npa_itest_segments_{uuid.uuid4().hex[:6]}")

    handle = run_operator(op, ctx)

    first = op.job_name_for_context(ctx)
    assert handle["job_name"] == segment_job_name(first, 3)
    assert handle["results_dir"].endswith(f"/{first}")  # every segment in segment 1's results dir
    assert read(cluster_ssh, f"{handle['results_dir']}/steps.log") == "".join(f"{n}\n" for n in range(1, 101))
    text = "\n".join(lines)
    assert re.search(r"Segment 1 of at most 3 ended to be continued \(COMPLETED.*, checkpoint: step 40\)", text)
    # segment 2 stayed past the warning: the child timeout ended it (else the limit would have)
    segment_2 = r"Segment 2 of at most 3 ended to be continued \((FAILED \(the child timeout\)|TIMEOUT \(time limit\))"
    assert re.search(segment_2 + r".*, checkpoint: step 80\)", text)
    assert "npa-test: done at step 100" in text
    usage = ctx["ti"].pushed["npa_usage"]
    if slurm_cluster.accounting:
        states = segment_states(cluster_ssh, first, 3)
        assert states.pop(segment_job_name(first, 2)) in ("FAILED", "TIMEOUT")
        assert states == {first: "COMPLETED", segment_job_name(first, 3): "COMPLETED"}
        assert [s["segment"] for s in usage["segments"]] == [1, 2, 3]
        assert usage["elapsed_seconds"] == sum(s["elapsed_seconds"] for s in usage["segments"])
    else:
        assert usage is None  # no accounting: never made up


def test_a_program_failure_in_segment_two_is_a_program_failure(slurm_cluster, cluster_ssh, logged):
    reset_pollers()
    command = 'if [ "$NPA_SEGMENT" = 1 ]; then echo "step 7" > "$NPA_CONTINUE_FILE"; exit 0; fi; exit 3'
    op = make_operator(command=command, max_segments=4, deferrable=False)
    lines = logged(op)
    ctx = task_context(f"npa_itest_segfail_{uuid.uuid4().hex[:6]}")

    with pytest.raises(AirflowFailException, match="a program failure, not retried") as failed:
        run_operator(op, ctx)

    assert segment_job_name(op.job_name_for_context(ctx), 2) in str(failed.value)
    assert any("Segment 1 of at most 4 ended to be continued (COMPLETED" in line for line in lines)


def test_a_run_still_asking_to_continue_at_max_segments_fails_with_advice(slurm_cluster, cluster_ssh, logged):
    reset_pollers()
    op = make_operator(command='echo "step $NPA_SEGMENT" > "$NPA_CONTINUE_FILE"', max_segments=2, deferrable=False)
    logged(op)
    ctx = task_context(f"npa_itest_segmax_{uuid.uuid4().hex[:6]}")

    with pytest.raises(AirflowFailException, match=r"max_segments=2\. Raise max_segments") as failed:
        run_operator(op, ctx)

    assert "segment 2, asked to be continued (COMPLETED" in str(failed.value)
    assert "checkpoint: step 2" in str(failed.value)


def test_a_time_limit_without_the_contract_fails_on_its_first_try_naming_the_options(
    slurm_cluster, cluster_ssh, logged
):
    reset_pollers()
    op = make_operator(command="sleep 300", time_hours=1 / 60, timeout_hours=10 / 3600, deferrable=False)
    logged(op)
    ctx = task_context(f"npa_itest_timeout_{uuid.uuid4().hex[:6]}")

    with pytest.raises(AirflowFailException) as failed:
        run_operator(op, ctx)

    message = str(failed.value)
    assert "reached its time limit" in message and "checkpoint_signal=" in message and "max_segments=" in message


# Preemption: a --requeue job of the gpu partition, its steps checkpointed as they go. The warning (sent at the
# preemption: preempt_send_user_signal) makes it stop stepping and wait; SIGTERM (after GraceTime) ends it. Slurm
# requeues it and it resumes from its checkpoint.
PREEMPTIBLE = """\
ckpt="${NPA_RESULTS_DIR}/ckpt" steps="${NPA_RESULTS_DIR}/steps.log" warned=0
step=$(cat "$ckpt" 2>/dev/null || echo 0)
echo "npa-test: run resumes at step $step"
trap 'warned=1; echo "npa-test: warned at step $step"' USR1
trap 'echo "npa-test: stopped at step $step"; exit 143' TERM
while [ "$step" -lt 40 ]; do
  if [ "$warned" = 0 ]; then step=$((step + 1)); echo "$step" >> "$steps"; echo "$step" > "$ckpt"; fi
  sleep 0.5 & wait $! || :  # a trapped signal interrupts the wait (and the warning reaches the sleep too)
done
echo "npa-test: done at step $step"
"""


def preempt_when_running(cluster_ssh, job_name: str, times: int, errors: list[str]) -> None:
    """Each time the job named `job_name` runs with a few steps done, submit an urgent job that needs its nodes."""
    for _ in range(times):
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            state = cluster_ssh(f"squeue -h -n {job_name} -o %T").stdout.strip()
            if state == "RUNNING":
                break
            time.sleep(1)
        else:
            errors.append(f"{job_name} never ran again")
            return
        time.sleep(4)  # a few steps
        urgent = cluster_ssh("sbatch --parsable -p urgent -N2 --gpus-per-node=8 -t 1 -o /dev/null --wrap 'sleep 2'")
        if urgent.returncode != 0:
            errors.append(urgent.stderr)
            return
        while time.monotonic() < deadline and cluster_ssh(f"squeue -h -n {job_name} -o %T").stdout.strip() in (
            "RUNNING",
            "COMPLETING",
        ):
            time.sleep(1)


def test_a_job_preempted_twice_is_requeued_resumes_and_succeeds_on_its_first_try(slurm_cluster, cluster_ssh, logged):
    reset_pollers()
    op = make_operator(
        command=PREEMPTIBLE, partition="gpu", gpus_per_node=8, checkpoint_signal="USR1@60", deferrable=False
    )
    lines = logged(op)
    ctx = task_context(f"npa_itest_preempt_{uuid.uuid4().hex[:6]}")
    errors: list[str] = []
    preempter = threading.Thread(
        target=preempt_when_running, args=(cluster_ssh, op.job_name_for_context(ctx), 2, errors), daemon=True
    )
    preempter.start()

    handle = run_operator(op, ctx)  # succeeds on try 1: no exception

    preempter.join(timeout=60)
    assert not errors
    assert handle["job_name"] == op.job_name_for_context(ctx)  # the same job all along: no new segment
    text = "\n".join(lines)
    assert read(cluster_ssh, f"{handle['results_dir']}/steps.log") == "".join(f"{n}\n" for n in range(1, 41)), text
    # Two urgent jobs, each preempting it at least once (Slurm may start the requeued job again before the urgent
    # one and preempt it once more): every run's restart count in its output. The wait says each requeue it sees
    # (PENDING in squeue after a run, or in sacct after sacct said RUNNING) and never one that did not happen; one
    # that ran again before a poll saw it pending cannot be seen (tests/unit/slurm/test_triggers.py: the rules).
    restarts = re.findall(r"npa: requeued by Slurm: restart (\d+)", text)
    assert len(restarts) >= 2 and restarts == [str(n) for n in range(1, len(restarts) + 1)], text
    said = len(re.findall(rf"Slurm job {handle['job_id']} was requeued", text))
    assert 1 <= said <= len(restarts), text
    assert text.count("npa-test: warned at step") >= 2, text  # the preemption warned the command each time


def test_a_job_preempted_without_requeue_is_resubmitted_without_spending_a_retry(slurm_cluster, cluster_ssh, logged):
    reset_pollers()
    op = make_operator(
        command=PREEMPTIBLE,
        partition="gpu",
        gpus_per_node=8,
        checkpoint_signal="USR1@60",
        requeue=False,
        max_preemptions=1,
        deferrable=False,
    )
    lines = logged(op)
    ctx = task_context(f"npa_itest_preempt_norequeue_{uuid.uuid4().hex[:6]}")
    first = op.job_name_for_context(ctx)
    errors: list[str] = []
    preempter = threading.Thread(target=preempt_when_running, args=(cluster_ssh, first, 1, errors), daemon=True)
    preempter.start()

    handle = run_operator(op, ctx)  # try 1 succeeds: the preemption cost no retry

    preempter.join(timeout=60)
    assert not errors
    text = "\n".join(lines)
    assert handle["job_name"] == segment_job_name(first, 2), text  # resubmitted once, as the next segment
    assert handle["results_dir"].endswith(f"/{first}")
    assert read(cluster_ssh, f"{handle['results_dir']}/steps.log") == "".join(f"{n}\n" for n in range(1, 41)), text
    assert "was preempted without requeue (PREEMPTED)" in text and "preemption 1 of at most 1" in text, text
    states = segment_states(cluster_ssh, first, 2)
    assert states == {first: "PREEMPTED", segment_job_name(first, 2): "COMPLETED"}
