"""One job, one owner, on the real cluster: a job is adopted, reattached or cancelled only by the task instance of
the deployment that submitted it. The jobs of "someone else" are real jobs: another Unix user's (npa-other), a job
of the same account with the task's exact name but without its owner proof, another deployment's (another key)."""

from __future__ import annotations

import shlex
import time
import uuid

import pytest

from npa_airflow.common import deployment as d
from npa_airflow.common.naming import job_name_for, legacy_job_name_for
from npa_airflow.exceptions import NpaCancelFailed
from npa_airflow.slurm.hook import SlurmHook
from tests.harness.airflow_tasks import make_submit_operator as make_operator
from tests.harness.airflow_tasks import submit_deferred, task_context

pytestmark = pytest.mark.integration

HELD = "--hold -p cpu -t 5 -o /dev/null --chdir=/tmp --wrap true"


def squeue_state(cluster_ssh, job_id: str) -> str:
    return cluster_ssh(f"squeue -h -t all -j {job_id} -o %T", check=True).stdout.strip()


def submit_as_npa(cluster_ssh, name: str, extra: str = "") -> str:
    out = cluster_ssh(f"sbatch --parsable -J {shlex.quote(name)} {extra} {HELD}", check=True).stdout
    return out.strip().splitlines()[-1]


def ids_named(cluster_ssh, name: str) -> list[str]:
    return cluster_ssh(f"squeue -h -t all --name={name} -o %i", check=True).stdout.split()


@pytest.fixture
def dag_id() -> str:
    return f"npa_itest_owner_{uuid.uuid4().hex[:6]}"


@pytest.fixture
def cleanup(cluster_ssh, cluster_admin):
    """Job ids to cancel at the end (as their owner: root may cancel any)."""
    ids: list[str] = []
    yield ids
    if ids:
        cluster_admin(f"scancel {' '.join(ids)}", check=False)


def test_another_user_s_job_with_this_task_s_exact_name_is_neither_adopted_nor_cancelled(
    slurm_cluster, cluster_ssh, cluster_admin, dag_id, cleanup
):
    ctx = task_context(dag_id, try_number=2)
    name_t1 = job_name_for(dag_id, "train", ctx["ti"].run_id, -1, 1, deployment=d.current_deployment())
    name_t2 = job_name_for(dag_id, "train", ctx["ti"].run_id, -1, 2, deployment=d.current_deployment())
    theirs = []
    for name in (name_t1, name_t2):  # an earlier try's name and this try's own
        out = cluster_admin(f"cd /tmp && runuser -u {slurm_cluster.other_user} -- sbatch --parsable -J {name} {HELD}")
        theirs.append(out.stdout.strip().splitlines()[-1])
    cleanup.extend(theirs)

    trigger = submit_deferred(make_operator(command="sleep 30", on_previous_try="cancel"), ctx)
    cleanup.append(trigger.handle.job_id)
    assert trigger.handle.job_id not in theirs and trigger.handle.retry_of is None
    assert [squeue_state(cluster_ssh, j) for j in theirs] == ["PENDING", "PENDING"]  # untouched


def test_a_job_of_this_account_with_the_task_s_name_but_not_its_proof_is_left_alone(cluster_ssh, dag_id, cleanup):
    """Another deployment sharing the account and (on purpose or not) the key's names, or a hand-made job: the
    name is not enough. Not adopted, not reattached, not cancelled by on_previous_try="cancel" nor by a kill."""
    ctx = task_context(dag_id, try_number=2)
    deployment = d.current_deployment()
    names = [job_name_for(dag_id, "train", ctx["ti"].run_id, -1, t, deployment=deployment) for t in (1, 2)]
    forged = deployment.owner_comment(names[0], uuid.uuid4()).rsplit(":", 1)[0] + ":" + "0" * 24
    held = [submit_as_npa(cluster_ssh, names[0], f"--comment={forged}"), submit_as_npa(cluster_ssh, names[1])]
    cleanup.extend(held)

    op = make_operator(command="sleep 30", on_previous_try="cancel")
    trigger = submit_deferred(op, ctx)
    cleanup.append(trigger.handle.job_id)
    assert trigger.handle.job_id not in held and trigger.handle.retry_of is None
    assert [squeue_state(cluster_ssh, j) for j in held] == ["PENDING", "PENDING"]

    # A kill of this try cancels by name only the job that carries this try's proof: its own.
    hook = SlurmHook("slurm_default")
    comment = op.owner_comment(ctx, names[1])
    hook.cancel_by_name(names[1], comment=comment)
    deadline = time.monotonic() + 30
    while squeue_state(cluster_ssh, trigger.handle.job_id) not in ("CANCELLED", ""):
        assert time.monotonic() < deadline, "this try's own job was not cancelled by name"
        time.sleep(0.5)
    assert squeue_state(cluster_ssh, held[1]) == "PENDING"  # same name, same account, no proof: still there


def test_two_deployments_with_the_same_dag_and_run_id_each_get_and_keep_their_own_job(
    monkeypatch, cluster_ssh, dag_id, cleanup
):
    """Scheduled runs have the same run id in every deployment: staging and prod submit two jobs, and a retry in
    each reattaches to its own."""
    run_id = "scheduled__2026-12-04T00:00:00+00:00"
    staging = d.Deployment("staging-deployment-key-000001", None, "test")
    prod = d.Deployment("prod-deployment-key-00000000001", None, "test")
    handles = {}
    for label, identity in (("staging", staging), ("prod", prod)):
        monkeypatch.setattr(d, "current_deployment", lambda identity=identity: identity)
        trigger = submit_deferred(make_operator(command="sleep 60"), task_context(dag_id, 1, run_id))
        handles[label] = trigger.handle.to_dict()
        cleanup.append(trigger.handle.job_id)
    assert handles["staging"]["job_id"] != handles["prod"]["job_id"]
    assert handles["staging"]["job_name"] != handles["prod"]["job_name"]
    for label, identity in (("staging", staging), ("prod", prod)):
        monkeypatch.setattr(d, "current_deployment", lambda identity=identity: identity)
        retry = submit_deferred(make_operator(command="sleep 60"), task_context(dag_id, 2, run_id))
        assert retry.handle.job_id == handles[label]["job_id"], f"{label}'s retry did not reattach to its own job"
    assert len(ids_named(cluster_ssh, handles["prod"]["job_name"])) == 1


def test_a_job_under_the_previous_release_s_name_is_found_once_after_the_upgrade(
    monkeypatch, cluster_ssh, dag_id, cleanup
):
    """The previous release named try 1 without the deployment key and gave it no comment: try 2, after the
    upgrade, reattaches to it; a job under that name submitted after the upgrade is another deployment's."""
    ctx = task_context(dag_id, try_number=2)
    old_name = legacy_job_name_for(dag_id, "train", ctx["ti"].run_id, -1, 1)
    old = submit_as_npa(cluster_ssh, old_name)
    cleanup.append(old)
    time.sleep(1.1)  # Slurm's submit times are whole seconds
    upgraded = d.Deployment(d.current_deployment().key, time.time(), "test")
    monkeypatch.setattr(d, "current_deployment", lambda: upgraded)
    trigger = submit_deferred(make_operator(command="sleep 30"), ctx)
    assert (trigger.handle.job_id, trigger.handle.job_name) == (old, old_name)

    newer = submit_as_npa(cluster_ssh, legacy_job_name_for(dag_id, "train", ctx["ti"].run_id, -1, 2))
    cleanup.append(newer)
    third = submit_deferred(make_operator(command="sleep 30"), task_context(dag_id, 3, ctx["ti"].run_id))
    cleanup.append(third.handle.job_id)
    assert third.handle.job_id == old  # the job of try 1 again (still live), never the post-upgrade one
    assert squeue_state(cluster_ssh, newer) == "PENDING"


def test_a_cancel_by_id_reaches_only_the_job_of_the_name_it_was_given(cluster_ssh, dag_id, cleanup):
    """An id read back from a handle someone else wrote: the job with that id is another task's, so nothing is
    cancelled."""
    victim = submit_as_npa(cluster_ssh, f"{dag_id}-victim")
    cleanup.append(victim)
    hook = SlurmHook("slurm_default")
    with pytest.raises(NpaCancelFailed, match=f"the job with that id is {dag_id}-victim, not this task.s"):
        hook.cancel(victim, job_name=f"npa-{dag_id}-0123456789-t1")
    assert squeue_state(cluster_ssh, victim) == "PENDING"
    assert hook.cancel(victim, job_name=f"{dag_id}-victim") == "cancelled"  # its own name: cancelled
