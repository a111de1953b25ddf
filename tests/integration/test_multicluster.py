"""Two real Slurm clusters behind one login host and one slurmdbd (dev/cluster: `npa`, the default, and `b`).

A job submitted to b is watched, cancelled and checked on b only, even when a job with the same id runs on npa
(the ids are made to collide: the administrator raises b's next id to that of a job running on npa, whose ids are
first moved past b's if needed). Everything the tests observe on the clusters is read with the ssh CLI
(`squeue -M`, `sacct -M`), not through the code under test.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.watch.poller import reset_pollers
from tests.harness.airflow_tasks import collecting_logger, submit_deferred, task_context
from tests.harness.airflow_tasks import job_name as job_name_for
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = [pytest.mark.integration, pytest.mark.second_cluster("a job on cluster b, reached through slurmdbd")]


def connection_json(slurm_cluster: Any, cluster_name: str | None) -> str:
    """The local cluster's connection, naming `cluster_name` (None: the login host's default cluster)."""
    conn = json.loads(slurm_cluster.conn_uri_json)
    conn["extra"].pop("cluster_name", None)
    if cluster_name is not None:
        conn["extra"]["cluster_name"] = cluster_name
    return json.dumps(conn)


def job_state(cluster_ssh: Callable[..., Any], cluster: str, job_id: str) -> str | None:
    """The job's state on `cluster`: squeue while slurmctld knows it, else its accounting record."""
    out = cluster_ssh(f"squeue -M {cluster} -h -t all -j {job_id} -o %T", check=False).stdout
    rows = [line for line in out.splitlines() if line.strip() and not line.startswith("CLUSTER:")]
    if rows:
        return rows[-1].strip()
    out = cluster_ssh(f"sacct -M {cluster} -X -n -P -j {job_id} -o State", check=True).stdout.split()
    return out[-1] if out else None


def wait_for_state(
    cluster_ssh: Callable[..., Any], cluster: str, job_id: str, wanted: str, timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while (state := job_state(cluster_ssh, cluster, job_id)) != wanted:
        assert time.monotonic() < deadline, f"job {job_id} on cluster {cluster} is {state}, never {wanted}"
        time.sleep(0.5)


def jobs_named(cluster_ssh: Callable[..., Any], cluster: str, name: str) -> list[str]:
    live = cluster_ssh(f"squeue -M {cluster} -h -t all --name={name} -o %i", check=True).stdout
    accounted = cluster_ssh(f"sacct -M {cluster} -X -n -P -S now-1hours --name={name} -o JobID", check=True).stdout
    return sorted({x for x in (live + accounted).split() if x.isdigit()})


def next_id_at_least(cluster_ssh: Callable[..., Any], cluster: str, floor: int) -> None:
    """Make `cluster`'s next job id at least `floor`, as a user can: submit held jobs and cancel them."""
    burn = f"sbatch --parsable -M {cluster} -H -J npa-mc-burn -o /dev/null --wrap true"
    while True:
        burnt = int(cluster_ssh(burn, check=True).stdout.strip().split(";")[0])
        cluster_ssh(f"scancel -M {cluster} {burnt}", check=True)
        if burnt + 1 >= floor:
            return
        count = min(floor - burnt - 1, 200)
        ids = cluster_ssh(f"for i in $(seq {count}); do {burn}; done", check=True).stdout.replace(f";{cluster}", "")
        cluster_ssh(f"scancel -M {cluster} {' '.join(ids.split())}", check=True)


def raise_first_job_id(conf: Path, first: int) -> None:
    """Set FirstJobId in b's slurm.conf, replacing the file whole: its slurmd re-read it on reconfigure, and a
    half-written file stops them. It stays until `dev/cluster up` renders the file again (a floor: harmless)."""
    lines = [line for line in conf.read_text().splitlines() if not line.startswith("FirstJobId=")]
    staged = conf.with_name(f".{conf.name}.{uuid.uuid4().hex[:6]}")
    staged.write_text("\n".join([*lines, f"FirstJobId={first}", ""]))
    staged.chmod(0o644)
    staged.replace(conf)


@pytest.fixture
def colliding_job(slurm_cluster, cluster_ssh, cluster_admin) -> Iterator[str]:
    """A running job of the cluster user on npa whose id the next job on b gets.

    npa's job is submitted as usual, once npa's ids have passed b's; the administrator then raises b's job id
    sequence to that id (FirstJobId in b's slurm.conf and `scontrol reconfigure` on b, which keeps the larger of
    it and the last id). npa's job is cancelled at the end.
    """
    b = slurm_cluster.cluster2
    b_last = cluster_ssh(f"sbatch --parsable -M {b} -H -J npa-mc-burn -o /dev/null --wrap true", check=True)
    b_last_id = int(b_last.stdout.strip().split(";")[0])
    cluster_ssh(f"scancel -M {b} {b_last_id}", check=True)
    next_id_at_least(cluster_ssh, "npa", b_last_id + 1)
    victim = cluster_ssh(
        "sbatch --parsable -J npa-mc-victim -p cpu -t 10 -o /dev/null --chdir=/tmp --wrap 'sleep 600'", check=True
    ).stdout.strip()
    try:
        raise_first_job_id(Path(slurm_cluster.slurm_conf2), int(victim))
        cluster_admin("scontrol reconfigure", slurm_conf=slurm_cluster.slurm_conf2)
        wait_for_state(cluster_ssh, "npa", victim, "RUNNING")
        yield victim
    finally:
        cluster_ssh(f"scancel {victim}")


# -- the job's cluster comes from its handle ----------------------------------------------------------------


def test_on_kill_cancels_the_job_on_its_own_cluster_and_leaves_the_same_id_on_the_other_running(
    slurm_cluster, cluster_ssh, colliding_job, monkeypatch
):
    """Submitted to b through a connection naming b; then that connection stops naming b (edited while the job
    runs): the trigger still watches b's job and on_kill cancels it on b. npa's job of the same id keeps running."""
    b = slurm_cluster.cluster2
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_B", connection_json(slurm_cluster, b))
    reset_pollers()
    install_supervisor(monkeypatch, "failed")  # the user marked the task failed
    op = make_operator(command="echo started on b; sleep 300", slurm_conn_id="slurm_b")
    trigger = run_for_task_instance(submit_deferred(op, task_context(f"npa_itest_mc_{uuid.uuid4().hex[:6]}")))
    job_id = trigger.handle.job_id
    try:
        assert (trigger.handle.cluster, job_id) == (b, colliding_job), "b's next id moved on"
        monkeypatch.setenv("AIRFLOW_CONN_SLURM_B", connection_json(slurm_cluster, None))
        wait_for_state(cluster_ssh, b, job_id, "RUNNING")
        kwargs = trigger.serialize()[1]

        async def kill_then_restart() -> tuple[list[str], dict]:
            trigger._log, watched = collecting_logger("mc-watch")
            run = asyncio.ensure_future(anext(trigger.run()))
            deadline = time.monotonic() + 60
            while "started on b" not in watched.lines:  # the poller has seen it running and tailed its log
                assert time.monotonic() < deadline and not run.done(), watched.lines
                await asyncio.sleep(0.2)
            run.cancel()  # the triggerer cancels the trigger for a user action, then calls on_kill
            await trigger.on_kill()
            await asyncio.to_thread(wait_for_state, cluster_ssh, b, job_id, "CANCELLED")
            restarted = run_for_task_instance(type(trigger)(**kwargs))  # a triggerer restart
            restarted._log, _ = collecting_logger("mc-restart")
            event = await asyncio.wait_for(anext(restarted.run()), 90)
            return watched.lines, event.payload

        lines, payload = asyncio.run(kill_then_restart())
        assert f"Slurm job {job_id} is RUNNING (RUNNING)" in lines
        assert payload["status"] == "canceled" and payload["native_state"] == "CANCELLED"
        assert job_state(cluster_ssh, "npa", colliding_job) == "RUNNING"  # the same id on npa: untouched
    finally:
        cluster_ssh(f"scancel -M {b} {job_id}")


def test_pre_submit_checks_read_the_partition_of_the_jobs_cluster(slurm_cluster, cluster_ssh, monkeypatch):
    """Partition `cpu` allows 8 h on npa but 2 h on b: a 3 h job for b is refused before anything is written."""
    b = slurm_cluster.cluster2
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_B", connection_json(slurm_cluster, b))
    dag_id = f"npa_itest_mc_limit_{uuid.uuid4().hex[:6]}"
    op = make_operator(command="true", slurm_conn_id="slurm_b", time_hours=3)
    ctx = task_context(dag_id)
    op.render_template_fields(ctx)
    name = job_name_for(dag_id, "train", ctx["ti"].run_id, -1, 1)
    try:
        with pytest.raises(NpaValidationError, match="partition 'cpu' allows at most 120 min"):
            op.execute(ctx)
    finally:
        submitted = jobs_named(cluster_ssh, b, name)
        for job_id in submitted:
            cluster_ssh(f"scancel -M {b} {job_id}")
    assert submitted == [] and jobs_named(cluster_ssh, "npa", name) == []


# -- --clusters/-M in extra_sbatch ----------------------------------------------------------------------------


def test_a_cluster_in_extra_sbatch_is_refused_before_anything_runs_and_its_advice_works(
    slurm_cluster, cluster_ssh, monkeypatch
):
    b = slurm_cluster.cluster2
    dag_id = f"npa_itest_mc_refuse_{uuid.uuid4().hex[:6]}"
    ctx = task_context(dag_id)
    name = job_name_for(dag_id, "train", ctx["ti"].run_id, -1, 1)
    messages = []
    for extra in ([f"--clusters={b}"], ["-M", b], [f"--cluster={b}"], [f"{{{{ '--clusters=' ~ {b!r} }}}}"]):
        try:
            with pytest.raises(NpaValidationError) as refused:
                op = make_operator(command="echo hello", extra_sbatch=extra)  # at DAG parse time...
                op.render_template_fields(ctx)  # ...or, for a templated entry, when it renders
                op.execute(ctx)
        finally:
            for cluster in ("npa", b):
                for job_id in jobs_named(cluster_ssh, cluster, name):  # only if the refusal failed
                    cluster_ssh(f"scancel -M {cluster} {job_id}")
        messages.append(str(refused.value))
    assert all("slurm_conn_id" in m and f'"cluster_name": "{b}"' in m for m in messages), messages
    assert jobs_named(cluster_ssh, "npa", name) == [] and jobs_named(cluster_ssh, b, name) == []
    results_dir = f"{slurm_cluster.results_root}/{name}"
    assert cluster_ssh(f"test -e {results_dir}").returncode == 1  # nothing staged either

    # Follow the advice: the same login host and user, with the extra "cluster_name" it names.
    advised = re.search(r'"cluster_name": "([^"]+)"', messages[0]).group(1)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_ADVISED", connection_json(slurm_cluster, advised))
    reset_pollers()
    op = make_operator(command="echo ran on the advised cluster", slurm_conn_id="slurm_advised", deferrable=False)
    op.render_template_fields(ctx)
    handle = op.execute(ctx)
    assert handle["cluster"] == b
    assert jobs_named(cluster_ssh, b, name) == [handle["job_id"]] and jobs_named(cluster_ssh, "npa", name) == []
    assert job_state(cluster_ssh, b, handle["job_id"]) == "COMPLETED"
