"""SlurmSubmitOperator, SlurmJobTrigger and the shared poller on the real local cluster, over real SSH.

Whole-DAG cases run through `dag.test()` in a subprocess with its own AIRFLOW_HOME (a real metadata DB;
Airflow 3.3 runs the deferred trigger in-process there). Cases that need a kill at a precise moment drive
the operator and the trigger directly with a task-instance context.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import collecting_logger, submit_deferred, task_context
from tests.harness.airflow_tasks import job_name as job_name_for
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.harness.slurm_accounting import accounted_jobs, accounted_usage, sacct_jobs
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
AIRFLOW = str(Path(PYTHON).with_name("airflow"))


# -- helpers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory, slurm_cluster) -> dict[str, str]:
    """A throwaway AIRFLOW_HOME with a migrated SQLite DB, and the cluster's connection."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW_CONN_SLURM_DEFAULT": slurm_cluster.conn_uri_json,
        "PYTHONPATH": str(REPO),
    }
    env.pop("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", None)
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env


RUNNER = textwrap.dedent(
    """
    import importlib.util, json, sys
    from sqlalchemy import select
    spec = importlib.util.spec_from_file_location("dag_under_test", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    dr = dag.test()
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    out = {"dag_run_state": str(dr.state), "run_id": dr.run_id, "tasks": {}}
    with create_session() as session:
        for ti in dr.get_task_instances(session=session):
            rows = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id,
                    XComModel.task_id == ti.task_id, XComModel.key == "slurm_job",
                )
            ).all()
            handle = rows[-1].value if rows else None
            if isinstance(handle, str):
                handle = json.loads(handle)
            out["tasks"][ti.task_id] = {"state": str(ti.state), "try_number": ti.try_number, "handle": handle}
    print("NPA_RESULT " + json.dumps(out))
    """
)


def run_dag_test(env: dict[str, str], dag_file: Path, timeout: float = 300) -> tuple[dict, str]:
    """Copy the DAG into the dags folder (dag.test() runs what the DAG processor serialized) and run it."""
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    dags.mkdir(exist_ok=True)
    target = dags / dag_file.name
    target.write_text(dag_file.read_text())
    runner = Path(env["AIRFLOW_HOME"]) / "run_dag_test.py"
    runner.write_text(RUNNER)
    proc = subprocess.run([PYTHON, str(runner), str(target)], env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("NPA_RESULT ")]
    assert lines, f"dag.test produced no result (rc {proc.returncode}):\n{output[-6000:]}"
    return json.loads(lines[-1][len("NPA_RESULT ") :]), output


def write_dag(directory: Path, dag_id: str, operator_kwargs: str, default_args: str = "{}") -> Path:
    path = directory / f"{dag_id}.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from datetime import timedelta
            from airflow.sdk import DAG
            from npa_airflow.slurm.operators import SlurmSubmitOperator

            with DAG(dag_id={dag_id!r}, schedule=None, catchup=False, default_args={default_args}) as dag:
                SlurmSubmitOperator(
                    task_id="train", partition="cpu", gpus_per_node=0, cpus_per_task=1, time_hours=0.1,
                    poll_interval=2, {operator_kwargs}
                )
            """
        )
    )
    return path


async def wait_state(hook: SlurmHook, job_id: str, wanted: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = (await hook.ajob_states([job_id])).get(job_id)
        if info is not None and info.native_state in wanted:
            return info.native_state
        await asyncio.sleep(1)
    raise AssertionError(f"job {job_id} never reached {wanted}")


# -- whole DAGs through dag.test() --------------------------------------------------------------------


def test_example_dag_runs_a_two_node_job_with_rendezvous_variables(airflow_home, tmp_path, cluster_ssh):
    result, output = run_dag_test(airflow_home, REPO / "dags_examples" / "slurm_train.py")
    train = result["tasks"]["train"]
    assert train["state"] == "success", output[-6000:]
    assert train["try_number"] == 1
    handle = train["handle"]
    assert handle["job_name"] == job_name_for("slurm_train", "train", result["run_id"], -1, 1)

    stdout = cluster_ssh(f"cat {handle['stdout_path']}", check=True).stdout
    rendezvous = sorted(line for line in stdout.splitlines() if line.startswith("rendezvous "))
    assert len(rendezvous) == 2, stdout
    first_node = rendezvous[0].split()[1].split("=")[1]
    for rank, line in enumerate(rendezvous):
        assert f"WORLD_SIZE=2 NUM_GPU_PER_NODE=0 NODE_RANK={rank} MASTER_ADDR={first_node} MASTER_PORT=29500" in line
    assert {line.split()[1] for line in rendezvous} == {"node=c1", "node=c2"}
    # the job's output was streamed into the task log while it ran
    assert "node 1 step 3" in output and "rendezvous node=c2" in output
    (job,) = accounted_jobs(cluster_ssh, handle["job_name"])
    assert job["id"] == handle["job_id"] and job["state"] == "COMPLETED"


def test_program_failure_fails_once_without_retry_and_shows_the_tail(airflow_home, tmp_path, cluster_ssh):
    dag_id = f"npa_itest_fail_{uuid.uuid4().hex[:6]}"
    dag_file = write_dag(
        tmp_path,
        dag_id,
        'command="echo loading config; echo \\"fatal: bad learning rate\\" >&2; exit 3"',
        default_args="{'retries': 2, 'retry_delay': timedelta(seconds=0)}",
    )
    result, output = run_dag_test(airflow_home, dag_file)
    train = result["tasks"]["train"]
    assert train["state"] == "failed"
    assert train["try_number"] == 1  # AirflowFailException: no retry consumed
    assert "a program failure, not retried" in output
    assert "fatal: bad learning rate" in output  # the log tail is in the failure message
    jobs = accounted_jobs(cluster_ssh, f"npa-{dag_id.replace('_', '-')}")
    assert [j["state"] for j in jobs] == ["FAILED"]


def test_environment_values_ending_in_newlines_reach_the_job_byte_for_byte(airflow_home, tmp_path, cluster_ssh):
    """Through dag.test(): the DAG's own Jinja renders the fields (it dropped a final newline before)."""
    dag_id = f"npa_itest_env_bytes_{uuid.uuid4().hex[:6]}"
    environment = {"NPA_NL": "a b\n", "NPA_NL2": "{{ 'x' }}\n\n", "NPA_ONLY_NL": "\n"}
    command = "; ".join(f'echo "== {n}"; printf %s "${n}" | od -c' for n in environment)
    dag_file = write_dag(tmp_path, dag_id, f"environment={environment!r}, command={command!r}")
    result, output = run_dag_test(airflow_home, dag_file)
    train = result["tasks"]["train"]
    assert train["state"] == "success", output[-6000:]
    stdout = cluster_ssh(f"cat {train['handle']['stdout_path']}", check=True).stdout
    for name, sent in {"NPA_NL": b"a b\n", "NPA_NL2": b"x\n\n", "NPA_ONLY_NL": b"\n"}.items():
        expected = subprocess.run(["od", "-c"], input=sent, capture_output=True, check=True).stdout.decode()
        assert f"== {name}\n{expected}" in stdout, stdout


@pytest.mark.slow
def test_infra_failure_is_retried_with_the_failed_node_excluded(airflow_home, tmp_path, cluster_ssh, cluster_admin):
    """NODE_FAIL on try 1 (the node is set down under the job): try 2 runs with `--exclude=<node>`."""
    import threading

    dag_id = f"npa_itest_infra_{uuid.uuid4().hex[:6]}"
    prefix = f"npa-{dag_id.replace('_', '-')}"
    dag_file = write_dag(
        tmp_path,
        dag_id,
        'command="sleep 15; echo finished", requeue=False',
        default_args="{'retries': 1, 'retry_delay': timedelta(seconds=0)}",
    )
    failed: dict[str, str] = {}

    def break_the_node_under_try_1() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not failed:
            out = cluster_ssh("squeue -h -o '%i %j %T %N'").stdout
            for line in out.splitlines():
                job_id, name, state, nodes = [*line.split(), "", "", "", ""][:4]
                if name.startswith(prefix) and name.endswith("-t1") and state == "RUNNING" and nodes:
                    cluster_admin(f"scontrol update nodename={nodes} state=down reason=npa-itest-node-fail")
                    failed.update(job_id=job_id, node=nodes)
                    break
            time.sleep(0.5)
        if failed:  # give the node back as soon as the job is NODE_FAIL: only the exclusion keeps try 2 off it
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not any(
                    j["state"] == "NODE_FAIL" for j in sacct_jobs(cluster_ssh, prefix)
                ):
                    time.sleep(0.5)
            finally:
                cluster_admin(f"scontrol update nodename={failed['node']} state=resume", check=False)

    watcher = threading.Thread(target=break_the_node_under_try_1, daemon=True)
    watcher.start()
    try:
        result, output = run_dag_test(airflow_home, dag_file, timeout=420)
    finally:
        watcher.join(timeout=120)
        if failed:
            cluster_admin(f"scontrol update nodename={failed['node']} state=resume", check=False)
    assert failed, "try 1 never ran"
    train = result["tasks"]["train"]
    assert train["state"] == "success", output[-6000:]
    assert train["try_number"] == 2
    assert "infrastructure reason (job state NODE_FAIL" in output
    handle = train["handle"]
    assert handle["job_name"].endswith("-t2") and handle["retry_of"] == failed["job_id"]
    script = cluster_ssh(f"cat {Path(handle['results_dir']).parent}/sbatch/{handle['job_name']}.sbatch", check=True)
    assert f"#SBATCH --exclude={failed['node']}" in script.stdout
    jobs = {j["name"][-3:]: j for j in accounted_jobs(cluster_ssh, prefix)}
    assert jobs["-t1"]["state"] == "NODE_FAIL"
    assert jobs["-t2"]["state"] == "COMPLETED" and jobs["-t2"]["nodes"] != failed["node"]


# -- driven directly ----------------------------------------------------------------------------------


def test_on_kill_of_the_trigger_cancels_the_job(slurm_cluster, cluster_ssh, monkeypatch):
    reset_pollers()
    install_supervisor(monkeypatch, "failed")  # the user marked the task failed
    op = make_operator(command="sleep 120")
    ctx = task_context(f"npa_itest_kill_{uuid.uuid4().hex[:6]}")
    trigger = run_for_task_instance(submit_deferred(op, ctx))
    job_id = trigger.handle.job_id

    async def scenario() -> str:
        hook = SlurmHook("slurm_default")
        await wait_state(hook, job_id, {"RUNNING"})
        run = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.sleep(3)
        run.cancel()  # the triggerer cancels the trigger for a user action, then calls on_kill
        await trigger.on_kill()
        return await wait_state(hook, job_id, {"CANCELLED"})

    assert asyncio.run(scenario()) == "CANCELLED"
    (job,) = accounted_jobs(cluster_ssh, trigger.handle.job_name)
    assert job["state"] == "CANCELLED"


def test_a_trigger_moved_to_another_triggerer_never_cancels_the_job(slurm_cluster, cluster_ssh, monkeypatch):
    """Airflow 3.3.2 calls on_kill of a trigger that only moved: the claim on the cluster tells the move."""
    reset_pollers()
    supervisor = install_supervisor(monkeypatch, "deferred")
    op = make_operator(command="for i in $(seq 1 40); do echo line $i; sleep 0.5; done")
    ctx = task_context(f"npa_itest_move_{uuid.uuid4().hex[:6]}")
    deferred = submit_deferred(op, ctx)
    handle, kwargs = deferred.handle.to_dict(), deferred.serialize()[1]
    first, second = (run_for_task_instance(type(deferred)(**kwargs)) for _ in range(2))

    async def scenario() -> tuple[str, dict]:
        hook = SlurmHook("slurm_default")
        await wait_state(hook, handle["job_id"], {"RUNNING"})
        held = asyncio.ensure_future(anext(first.run()))
        await asyncio.sleep(4)
        taken = asyncio.ensure_future(anext(second.run()))  # the other triggerer starts the same trigger
        for _ in range(300):
            if first._registration is not None and first._registration.superseded:
                break
            await asyncio.sleep(0.1)
        held.cancel()
        supervisor.state = "failed"  # even a task that has meanwhile ended is not the moved trigger's to cancel
        await first.on_kill()
        assert not held.done() or held.cancelled()
        event = await asyncio.wait_for(taken, 120)
        return await wait_state(hook, handle["job_id"], {"COMPLETED", "CANCELLED"}), event.payload

    state, payload = asyncio.run(scenario())
    assert state == "COMPLETED" and payload["status"] == "success"


def test_ambiguous_submission_after_ssh_drop_yields_exactly_one_job(slurm_cluster, cluster_ssh, monkeypatch):
    """The SSH session is killed right after sbatch ran (its reply is lost): the job is adopted by name."""
    drops = []
    original = SlurmHook.arun

    async def arun_dropping_after_sbatch(self, argv, **kwargs):
        if isinstance(argv, str) and "sbatch --parsable" in argv and not drops:
            drops.append(argv)
            argv = argv + "\nkill -KILL $PPID"  # the sshd session dies after sbatch printed its id
        return await original(self, argv, **kwargs)

    monkeypatch.setattr(SlurmHook, "arun", arun_dropping_after_sbatch)
    op = make_operator(command="echo adopted")
    ctx = task_context(f"npa_itest_ambig_{uuid.uuid4().hex[:6]}")
    trigger = submit_deferred(op, ctx)
    assert drops, "the drop was not injected"
    jobs = accounted_jobs(cluster_ssh, trigger.handle.job_name)
    time.sleep(2)  # a duplicate submitted in the same instant would be accounted by now too
    jobs = sacct_jobs(cluster_ssh, trigger.handle.job_name)
    assert [j["id"] for j in jobs] == [trigger.handle.job_id]


def test_reattach_after_the_worker_is_killed(slurm_cluster, cluster_ssh, tmp_path):
    dag_id = f"npa_itest_reattach_{uuid.uuid4().hex[:6]}"
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(REPO)!r})
            from tests.harness.airflow_tasks import make_submit_operator as make_operator, task_context
            op = make_operator(command="sleep 25; echo finished", deferrable=False)
            ctx = task_context({dag_id!r}, try_number=1, run_id={run_id!r})
            op.render_template_fields(ctx)
            op.execute(ctx)
            """
        )
    )
    env = {**os.environ, "AIRFLOW_CONN_SLURM_DEFAULT": slurm_cluster.conn_uri_json}
    proc = subprocess.Popen([PYTHON, str(worker)], env=env, start_new_session=True)
    first_name = job_name_for(dag_id, "train", run_id, -1, 1)
    try:
        deadline = time.monotonic() + 60
        while not cluster_ssh(f"squeue -h -o %i --name={first_name}", check=True).stdout.strip():
            assert time.monotonic() < deadline, "the worker never submitted"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker dies without on_kill: the job keeps running
        proc.wait()
    (first,) = accounted_jobs(cluster_ssh, first_name)

    op = make_operator(command="sleep 25; echo finished")
    trigger = submit_deferred(op, task_context(dag_id, try_number=2, run_id=run_id))
    assert trigger.handle.job_id == first["id"]  # reattached: no second job
    assert sacct_jobs(cluster_ssh, job_name_for(dag_id, "train", run_id, -1, 2)) == []
    cluster_ssh(f"scancel {first['id']}")


def test_logs_stream_in_order_without_duplicates_across_a_trigger_restart(slurm_cluster):
    op = make_operator(command="for i in $(seq 1 40); do echo line-$i; sleep 0.25; done")
    trigger = submit_deferred(op, task_context(f"npa_itest_logs_{uuid.uuid4().hex[:6]}"))
    kwargs = trigger.serialize()[1]

    async def first_run() -> list[str]:
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        t = SlurmJobTrigger(**kwargs)
        t._log, collected = collecting_logger("first")
        task = asyncio.ensure_future(anext(t.run()))
        deadline = time.monotonic() + 90
        while sum(1 for x in collected.lines if x.startswith("line-")) < 5:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.2)
        task.cancel()  # triggerer shutdown: no event, no on_kill
        with pytest.raises(asyncio.CancelledError):
            await task
        await t.cleanup()
        return collected.lines

    async def second_run() -> tuple[list[str], dict]:
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        t = SlurmJobTrigger(**kwargs)  # rebuilt from the stored kwargs, as a new triggerer does
        t._log, collected = collecting_logger("second")
        event = await asyncio.wait_for(anext(t.run()), 120)
        return collected.lines, event.payload

    reset_pollers()
    before = asyncio.run(first_run())
    reset_pollers()
    after, payload = asyncio.run(second_run())
    assert payload["status"] == "success"
    streamed = [x for x in before + after if x.startswith("line-")]
    assert streamed == [f"line-{i}" for i in range(1, 41)]
    assert any(x.startswith("line-") for x in after)


def test_triggerer_killed_hard_between_polls_does_not_replay_the_log(slurm_cluster):
    """SIGKILL semantics: no cleanup() runs. A triggerer spends nearly all its time between polls; killed there,
    the offsets of the lines it already wrote must already be on the cluster, so nothing is logged twice."""
    op = make_operator(command="for i in $(seq 1 40); do echo line-$i; sleep 0.25; done")
    trigger = submit_deferred(op, task_context(f"npa_itest_kill_{uuid.uuid4().hex[:6]}"))
    kwargs = trigger.serialize()[1]

    async def killed_run() -> list[str]:
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        t = SlurmJobTrigger(**kwargs)
        t._log, collected = collecting_logger("killed")
        task = asyncio.ensure_future(anext(t.run()))
        deadline = time.monotonic() + 90
        while sum(1 for x in collected.lines if x.startswith("line-")) < 5:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        # Kill within the quiet time between polls (the poll floor is 2 s): 1 s after the lines were logged.
        await asyncio.sleep(1.0)
        task.cancel()  # and no cleanup(): the process is gone
        with pytest.raises(asyncio.CancelledError):
            await task
        return collected.lines

    async def next_run() -> tuple[list[str], dict]:
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        t = SlurmJobTrigger(**kwargs)
        t._log, collected = collecting_logger("next")
        event = await asyncio.wait_for(anext(t.run()), 120)
        return collected.lines, event.payload

    reset_pollers()
    before = asyncio.run(killed_run())
    reset_pollers()
    after, payload = asyncio.run(next_run())
    assert payload["status"] == "success"
    streamed = [x for x in before + after if x.startswith("line-")]
    assert streamed == [f"line-{i}" for i in range(1, 41)]


def test_non_deferrable_waits_on_the_worker_through_the_same_poller(slurm_cluster, monkeypatch):
    reset_pollers()
    op = make_operator(command="echo worker-side-1; sleep 2; echo worker-side-2", deferrable=False)
    logger, collected = collecting_logger("worker")
    monkeypatch.setattr(type(op), "log", property(lambda self: logger))
    ctx = task_context(f"npa_itest_worker_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    handle = op.execute(ctx)
    assert handle == ctx["ti"].pushed["slurm_job"]
    streamed = [x for x in collected.lines if x.startswith("worker-side-")]
    assert streamed == ["worker-side-1", "worker-side-2"]


@pytest.mark.accounting("compares the task's GPU-hours with sacct's own AllocTRES and ElapsedRaw")
def test_gpu_hours_of_a_two_node_job_are_what_accounting_recorded(slurm_cluster, cluster_ssh, monkeypatch):
    """2 nodes x 8 GPUs (the bed's gpu partition: g1, g2, Gres=gpu:8 each) for 20 s: XCom npa_usage and the task's
    GPU-usage line say what sacct itself says of the job. Exactly, when the end came from sacct; within 1 s per node
    when the poller took it from squeue before accounting had it (the usage is then sacct's RUNNING record's, its
    elapsed time counted to that poll)."""
    from npa_airflow.slurm.commands import JobUsage
    from npa_airflow.slurm.triggers import SlurmJobTrigger
    from npa_airflow.slurm.watch.trigger_events import usage_line

    op = make_operator(command="sleep 20; echo usage-done", partition="gpu", nodes=2, gpus_per_node=8)
    ctx = task_context(f"npa_itest_usage_{uuid.uuid4().hex[:6]}")
    watcher = SlurmJobTrigger(**submit_deferred(op, ctx).serialize()[1])
    watcher._log, _ = collecting_logger("usage-trigger")

    async def wait() -> tuple[dict, int]:
        event = await asyncio.wait_for(anext(watcher.run()), 300)
        return event.payload, watcher._poller().stats.ended_before_accounting

    reset_pollers()
    payload, early = asyncio.run(wait())
    assert payload["status"] == "success", payload
    logger, collected = collecting_logger("usage")
    monkeypatch.setattr(type(op), "log", property(lambda self: logger))
    op.execute_complete(ctx, payload)
    usage = ctx["ti"].pushed["npa_usage"]

    alloc, elapsed = accounted_usage(cluster_ssh, watcher.handle.job_id)
    assert (alloc.get("gres/gpu"), alloc.get("node")) == (16, 2), alloc  # the bed tracks gres/gpu
    assert elapsed >= 20
    assert (usage["gpus"], usage["nodes"]) == (16, 2), usage
    slack = usage["nodes"] if early else 0  # seconds of elapsed time: 1 per node
    assert abs(usage["elapsed_seconds"] - elapsed) <= slack, (usage, elapsed, early)
    assert usage["gpu_hours"] == pytest.approx(16 * elapsed / 3600, abs=16 * slack / 3600)
    assert usage["gpu_hours"] == 16 * usage["elapsed_seconds"] / 3600
    assert collected.lines[-1] == usage_line(JobUsage(16, 2, usage["elapsed_seconds"]), "")
    assert collected.lines[-1].startswith("GPU usage: 0.") and "(16 GPUs on 2 nodes x " in collected.lines[-1]


def test_sensor_waits_for_a_job_submitted_elsewhere(slurm_cluster):
    from airflow.sdk.exceptions import TaskDeferred

    from npa_airflow.slurm.sensors import SlurmJobSensor
    from npa_airflow.slurm.triggers import SlurmJobTrigger

    op = make_operator(command="sleep 3; echo sensed")
    submitted = submit_deferred(op, task_context(f"npa_itest_sensor_{uuid.uuid4().hex[:6]}"))
    job = json.dumps(submitted.handle.to_dict())
    sensor = SlurmJobSensor(task_id="wait", job=job, poke_interval=2, stream_logs=True)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(task_context("sensor_dag"))
    trigger = SlurmJobTrigger(**deferred.value.trigger.serialize()[1])
    trigger._log, collected = collecting_logger("sensor")
    reset_pollers()

    async def wait() -> dict:
        return (await asyncio.wait_for(anext(trigger.run()), 120)).payload

    payload = asyncio.run(wait())
    # the sensor only watches: no file of the job is its own
    watched = {**submitted.handle.to_dict(), "script_path": None}
    assert sensor.execute_complete(task_context("sensor_dag"), payload) == watched
    assert "sensed" in collected.lines

    # a bare job id works too (state only)
    bare = SlurmJobSensor(task_id="wait_id", job=submitted.handle.job_id, deferrable=False)
    assert bare.poke(task_context("sensor_dag")) is True


def test_session_secret_reaches_the_job_only_through_the_shredded_sidecar(slurm_cluster, cluster_ssh, monkeypatch):
    secret = f"npa-itest-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AIRFLOW_VAR_NPA_ITEST_TOKEN", secret)
    reset_pollers()
    op = make_operator(
        command='echo "token length $(printf %s "$NPA_SESSION_TOKEN" | wc -c)"; echo "$NPA_SESSION_TOKEN" | sha256sum',
        secret_env={"NPA_SESSION_TOKEN": "var:npa_itest_token"},
        deferrable=False,
    )
    logger, collected = collecting_logger("secret")
    monkeypatch.setattr(type(op), "log", property(lambda self: logger))
    ctx = task_context(f"npa_itest_secret_{uuid.uuid4().hex[:6]}")
    op.render_template_fields(ctx)
    handle = op.execute(ctx)

    import hashlib

    digest = hashlib.sha256(f"{secret}\n".encode()).hexdigest()
    assert f"token length {len(secret)}" in collected.lines
    assert any(line.startswith(digest) for line in collected.lines)  # the job saw exactly the secret
    assert secret not in op.sbatch_script and secret not in json.dumps(handle)
    assert not any(secret in line for line in collected.lines)
    sidecar = f"{Path(handle['results_dir']).parent}/sidecars/{handle['job_name']}.env"
    assert sidecar in op.sbatch_script
    assert cluster_ssh(f"test -e {sidecar}").returncode == 1  # shredded when the job exited
