"""What differs between the Slurm releases the provider is tested on (the 22.05 and 24.11 beds, dev/cluster), as
the real tools answer, and what the hook does about it. Run on each bed (NPA_SLURM_VERSION=24.11 for the second)."""

from __future__ import annotations

import asyncio
import shlex
import time
import uuid

import pytest

from npa_airflow.slurm import commands
from npa_airflow.slurm.hook import SlurmHook

pytestmark = pytest.mark.integration


@pytest.fixture
def held_job(cluster_ssh):
    """A job held on submission (Reason JobHeldUser) on the default cluster; cancelled afterwards."""
    job_id = cluster_ssh(
        f"sbatch --parsable -p cpu -o /dev/null -J npa-versions-{uuid.uuid4().hex[:6]} --hold --wrap true", check=True
    ).stdout.strip()
    yield job_id
    cluster_ssh(f"scancel {job_id}")


def _states(cluster_ssh, argv: list[str] | str) -> dict[str, commands.SlurmJobInfo]:
    command = argv if isinstance(argv, str) else shlex.join(argv)
    return commands.parse_squeue(cluster_ssh(command, check=True).stdout)


@pytest.mark.accounting("compares sacct's reason of a pending job with squeue's")
def test_only_squeue_knows_a_pending_jobs_reason_on_every_version(slurm_cluster, cluster_ssh, held_job):
    deadline = time.monotonic() + 30
    while True:  # accounting records a job a moment after its submission
        sacct = commands.parse_sacct(
            cluster_ssh(shlex.join(commands.build_sacct_states([held_job])), check=True).stdout
        )
        if held_job in sacct or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    squeue = _states(cluster_ssh, commands.build_squeue_states([held_job]))
    assert squeue[held_job].reason == "JobHeldUser"
    assert sacct[held_job].state.value == "PENDING"
    if slurm_cluster.slurm_version == "24.11":
        assert sacct[held_job].reason is None  # accounting prints Reason=None for every pending job


def test_squeue_only_job_state_is_there_from_24_11_and_answers_states_only(slurm_cluster, cluster_ssh, held_job):
    detecting = cluster_ssh(commands.build_squeue_states_detecting([held_job]), check=True).stdout
    only, text = commands.split_squeue_form(detecting)
    assert only is (slurm_cluster.slurm_version != "22.05")
    info = commands.parse_squeue(text)[held_job]
    assert (info.native_state, info.job_name is None, info.reason is None) == ("PENDING", only, only)
    if only:  # an id slurmctld does not know: an empty answer, where the full form fails ("Invalid job id")
        gone = cluster_ssh(shlex.join(commands.build_squeue_only_states(["999999"])))
        assert (gone.returncode, gone.stdout) == (0, "")


@pytest.mark.second_cluster("squeue -M b")
def test_squeue_only_job_state_ignores_the_cluster_on_24_11(slurm_cluster, cluster_ssh, held_job):
    """Why the hook never sends --only-job-state with -M: 24.11.5 answers for the login host's default cluster
    (under a "CLUSTER: b" banner without -h). If this fails, Slurm fixed it: the hook may then use it with -M."""
    if slurm_cluster.slurm_version == "22.05":
        pytest.skip("22.05's squeue has no --only-job-state")
    b = slurm_cluster.cluster2
    out = cluster_ssh(f"squeue -h -t all --only-job-state -M {b} --jobs={held_job} -o %i", check=True).stdout
    on_b = cluster_ssh(f"squeue -h -t all -M {b} -o %i", check=True).stdout.split()
    assert out.split() == [held_job] and held_job not in on_b, (out, on_b)


@pytest.mark.accounting("the squeue form is learnt for the squeue that follows a sacct")
def test_the_hook_learns_once_per_connection_which_squeue_form_to_send(slurm_cluster):
    """A job sacct does not know (not pending: no squeue rides with the sacct) costs one squeue after it: the first
    on a connection checks `squeue --help` itself, the next ones are sent as learnt; both answer "absent"."""
    sent: list[str] = []

    class Counting(SlurmHook):
        async def arun(self, argv, **kwargs):
            sent.append(argv if isinstance(argv, str) else " ".join(argv))
            return await super().arun(argv, **kwargs)

    async def scenario():
        hook = Counting("slurm_default")
        return [await hook.aquery_jobs(["999999"]) for _ in range(2)]

    first, second = asyncio.run(scenario())
    assert first.absent == second.absent == {"999999"}
    squeues = [c for c in sent if "squeue" in c]
    assert len(squeues) == 2 and "--help" in squeues[0] and "--help" not in squeues[1]
    assert ("--only-job-state" in squeues[1]) is (slurm_cluster.slurm_version != "22.05")
