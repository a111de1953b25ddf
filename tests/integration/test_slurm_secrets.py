"""`secret_env` on the real local cluster, over real SSH: the sidecar outlives a requeue and goes once the job has
ended for good (its last run, a cancel, the poller seeing the end), and a job that prints its secrets shows masks.

The operator and its trigger are driven directly with a task-instance context; the trigger is rebuilt from its
serialised kwargs, as a triggerer does, so it resolves the `secret_env` references itself. The secrets are
Variables (AIRFLOW_VAR_*) whose names Airflow's masker does not consider sensitive: only an explicit mask hides them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.triggers import SlurmJobTrigger
from npa_airflow.slurm.watch import poller as poller_mod
from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import collecting_logger, submit_deferred, task_context
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = pytest.mark.integration


def variable(monkeypatch: pytest.MonkeyPatch, value: str) -> str:
    """A Variable holding `value`; returns its `secret_env` reference."""
    key = f"npa_itest_plain_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_VAR_{key.upper()}", value)
    return f"var:{key}"


def sidecar_of(handle: dict) -> str:
    assert handle["env_file"] == f"{Path(handle['results_dir']).parent}/sidecars/{handle['job_name']}.env"
    return handle["env_file"]


def as_a_triggerer_would(trigger: SlurmJobTrigger, name: str) -> tuple[SlurmJobTrigger, list[str]]:
    """The trigger rebuilt from its serialised kwargs (nothing but references), logging into a collector."""
    rebuilt = run_for_task_instance(SlurmJobTrigger(**trigger.serialize()[1]))
    rebuilt._log, collected = collecting_logger(name)
    return rebuilt, collected.lines


async def wait_for(probe, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (result := await probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.5)
    return result


def record_shred_cycle(monkeypatch) -> dict[str, int]:
    """The poller cycle that first reported the job ended, and the one whose command shredded its files."""
    seen: dict[str, int] = {}
    update_for, shredded = poller_mod.SlurmPoller._update_for, poller_mod.SlurmPoller._shredded

    def recording_update(reg, cycle_no, *args):
        if reg.state.is_terminal:
            seen.setdefault("ended", cycle_no)
        return update_for(reg, cycle_no, *args)

    def recording_shred(self, regs):
        if regs:
            seen.setdefault("shredded", self.stats.cycles)
        shredded(self, regs)

    monkeypatch.setattr(poller_mod.SlurmPoller, "_update_for", staticmethod(recording_update))
    monkeypatch.setattr(poller_mod.SlurmPoller, "_shredded", recording_shred)
    return seen


# -- item: the sidecar outlives a requeue ---------------------------------------------------------------------


def requeue_by_admin(cluster_admin, cluster_ssh, job_id: str) -> None:
    cluster_admin(f"scontrol requeue {job_id}")


def requeue_by_node_failure(cluster_admin, cluster_ssh, job_id: str) -> None:
    """The node under run 0 goes down: NODE_FAIL, and Slurm requeues the job (sacct says NODE_FAIL for seconds
    while squeue already says PENDING). The node comes back as soon as the job is queued again."""
    node = cluster_ssh(f"squeue -h -j {job_id} -o %N", check=True).stdout.strip()
    cluster_admin(f"scontrol update nodename={node} state=down reason=npa-itest-requeue")
    try:
        deadline = time.monotonic() + 60
        while cluster_ssh(f"squeue -h -j {job_id} -o %T").stdout.strip() not in ("PENDING", "REQUEUED"):
            assert time.monotonic() < deadline, "the job was not requeued after its node failed"
            time.sleep(0.3)
    finally:
        cluster_admin(f"scontrol update nodename={node} state=resume", check=False)


@pytest.mark.slow
@pytest.mark.parametrize("requeue", [requeue_by_admin, requeue_by_node_failure], ids=["scontrol", "node_fail"])
@pytest.mark.accounting("reads the runs of the requeued job from sacct --duplicates")
def test_a_requeued_job_gets_its_secret_again_and_the_sidecar_goes_with_its_end(
    slurm_cluster, cluster_ssh, cluster_admin, monkeypatch, requeue
):
    """Run 0 is ended by the requeue (SIGTERM, or its node gone) and run 1 starts; run 1 fails (exit 3), so the
    script leaves the sidecar and the poller must shred it in the cycle that sees FAILED, before the trigger
    fires. Each run appends its evidence to a results file (Slurm truncates stdout for the new run)."""
    secret = f"npa-requeue-{uuid.uuid4().hex}"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    reset_pollers()
    op = make_operator(
        command=(
            'run="${SLURM_RESTART_COUNT:-0}"; '
            'echo "run $run digest $(printf %s "$NPA_TOKEN" | sha256sum | cut -d" " -f1)" >> {results_dir}/runs; '
            'if [ "$run" = 0 ]; then sleep 300; fi; exit 3'
        ),
        secret_env={"NPA_TOKEN": variable(monkeypatch, secret)},
    )
    deferred = submit_deferred(op, task_context(f"npa_itest_requeue_{uuid.uuid4().hex[:6]}"))
    handle = deferred.handle.to_dict()
    sidecar = sidecar_of(handle)
    runs = f"{handle['results_dir']}/runs"
    install_supervisor(monkeypatch, "deferred")
    trigger, _ = as_a_triggerer_would(deferred, "requeue")
    cycles = record_shred_cycle(monkeypatch)

    async def scenario() -> tuple[dict, bool]:
        hook = SlurmHook("slurm_default")
        run = asyncio.ensure_future(anext(trigger.run()))

        async def first_run_started() -> bool:
            return (await hook.arun(f"grep -c '^run 0 ' {runs}", check=False)).text.strip() == "1"

        await wait_for(first_run_started, "run 0 of the job")
        await asyncio.to_thread(requeue, cluster_admin, cluster_ssh, handle["job_id"])
        event = await asyncio.wait_for(run, 240)
        gone = not await hook.apath_exists(sidecar)  # at the moment the event fired
        return event.payload, gone

    payload, gone_at_event = asyncio.run(scenario())
    evidence = cluster_ssh(f"cat {runs}", check=True).stdout.splitlines()
    stderr = cluster_ssh(f"cat {handle['stderr_path']}").stdout
    assert evidence == [f"run 0 digest {digest}", f"run 1 digest {digest}"], (evidence, stderr)  # run 1 had it
    # run 0 ended under srun: srun may return 0 then (a node failure), and that run is not a success
    assert cluster_ssh(f"test -e {handle['results_dir']}/status.json").returncode == 1, "run 0 wrote status.json"
    assert payload["status"] == "failed" and payload["exit_code"] == 3, payload  # the requeue was not an end
    assert gone_at_event, "the sidecar was still there when the job's end was reported"
    assert cycles["shredded"] == cycles["ended"], cycles  # in the command of the cycle that saw the end
    accounting = cluster_ssh(f"sacct -n -X -D -P -o State -j {handle['job_id']}", check=True).stdout.split()
    assert accounting[0] in ("REQUEUED", "NODE_FAIL") and accounting[-1] == "FAILED", accounting


# -- the cancel path and the never-started job ---------------------------------------------------------------


def pending_job_with_a_secret(monkeypatch, tag: str) -> tuple[dict, SlurmJobTrigger]:
    reset_pollers()
    op = make_operator(
        command='echo "never runs: $NPA_TOKEN"',
        extra_sbatch=["--begin=now+3600"],  # eligible in an hour: PENDING (BeginTime) for the whole test
        secret_env={"NPA_TOKEN": variable(monkeypatch, f"npa-pending-{uuid.uuid4().hex}")},
    )
    deferred = submit_deferred(op, task_context(f"npa_itest_{tag}_{uuid.uuid4().hex[:6]}"))
    return deferred.handle.to_dict(), deferred


def test_a_job_cancelled_outside_airflow_before_it_ran_loses_its_sidecar(slurm_cluster, cluster_ssh, monkeypatch):
    handle, deferred = pending_job_with_a_secret(monkeypatch, "pendcancel")
    sidecar = sidecar_of(handle)
    assert cluster_ssh(f"test -f {sidecar}").returncode == 0
    trigger, _ = as_a_triggerer_would(deferred, "pendcancel")

    async def scenario() -> dict:
        run = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.sleep(4)  # watched while PENDING
        cluster_ssh(f"scancel {handle['job_id']}", check=True)
        return (await asyncio.wait_for(run, 120)).payload

    payload = asyncio.run(scenario())
    assert payload["status"] == "canceled"
    assert cluster_ssh(f"test -e {sidecar}").returncode == 1, "the sidecar of a job that never ran was left behind"


def test_a_user_kill_of_a_pending_job_cancels_it_and_shreds_its_sidecar(slurm_cluster, cluster_ssh, monkeypatch):
    handle, deferred = pending_job_with_a_secret(monkeypatch, "pendkill")
    sidecar = sidecar_of(handle)
    install_supervisor(monkeypatch, "failed")  # the user marked the task failed
    trigger, _ = as_a_triggerer_would(deferred, "pendkill")

    async def scenario() -> None:
        run = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.sleep(4)
        run.cancel()  # the triggerer cancels the trigger for a user action, then calls on_kill
        await trigger.on_kill()

    asyncio.run(scenario())
    job_id = handle["job_id"]
    ask = f"sacct -n -X -P -o State -j {job_id}" if slurm_cluster.accounting else f"squeue -h -t all -o %T -j {job_id}"
    state = cluster_ssh(ask, check=True).stdout.split()
    assert state and state[0].startswith("CANCELLED"), state
    assert cluster_ssh(f"test -e {sidecar}").returncode == 1


# -- item: secrets are masked in the task log even when the job prints them ---------------------------------


def printing_job(monkeypatch) -> tuple[dict[str, str], list[str]]:
    """secret_env of three Variables (plain, multi-line, regex metacharacters) and every fragment that must
    never appear; the job prints them with text around them, alone, and through `env`."""
    tag = uuid.uuid4().hex[:10]
    values = {
        "HCI_API_KEY": f"plain-{tag}",
        "NPA_MULTI": f"first-line-{tag}\nsecond-line-{tag}\n",
        "NPA_REGEX": f"a.b*c(d)+[e]?$f^g|h\\i{{2}}-{tag}",
    }
    refs = {name: variable(monkeypatch, value) for name, value in values.items()}
    fragments = [line for value in values.values() for line in value.splitlines()]
    return refs, fragments


PRINT_SECRETS = (
    'echo "key=$HCI_API_KEY!"; echo "$HCI_API_KEY"; printf "%s\\n" "$NPA_MULTI"; echo "x${NPA_REGEX}y"; '
    "env | grep -E '^(HCI_API_KEY|NPA_MULTI|NPA_REGEX)=' ; echo printed-all"
)


def test_a_deferred_job_printing_its_secrets_shows_masks_in_the_trigger_log_and_event(slurm_cluster, monkeypatch):
    refs, fragments = printing_job(monkeypatch)
    reset_pollers()
    op = make_operator(command=PRINT_SECRETS + "; exit 3", secret_env=refs)
    deferred = submit_deferred(op, task_context(f"npa_itest_mask_{uuid.uuid4().hex[:6]}"))
    kwargs = deferred.serialize()[1]
    assert kwargs["secret_env"] == refs
    trigger, lines = as_a_triggerer_would(deferred, "mask")

    async def wait() -> dict:
        return (await asyncio.wait_for(anext(trigger.run()), 120)).payload

    payload = asyncio.run(wait())
    text = "\n".join(lines) + "\n" + str(payload) + "\n" + str(kwargs)
    assert "printed-all" in lines, lines
    leaked = [f for f in fragments if f in text]
    assert not leaked, f"secrets in the task log or the event: {leaked}\n" + "\n".join(lines)
    assert "key=***!" in lines and "x***y" in lines and "HCI_API_KEY=***" in lines


def test_a_worker_side_wait_and_its_failure_message_mask_the_secrets(slurm_cluster, monkeypatch):
    refs, fragments = printing_job(monkeypatch)
    reset_pollers()
    op = make_operator(command=PRINT_SECRETS + "; exit 3", secret_env=refs, deferrable=False)
    logger, collected = collecting_logger("worker-mask")
    monkeypatch.setattr(type(op), "log", property(lambda self: logger))
    ctx = task_context(f"npa_itest_wmask_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    with pytest.raises(AirflowFailException) as failed:
        op.execute(ctx)
    text = "\n".join(collected.lines) + "\n" + str(failed.value) + "\n" + str(ctx["ti"].pushed)
    assert "printed-all" in collected.lines and "printed-all" in str(failed.value)
    leaked = [f for f in fragments if f in text]
    assert not leaked, f"secrets in the worker's log or failure message: {leaked}\n{text}"
    assert "key=***!" in collected.lines
