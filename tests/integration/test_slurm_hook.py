"""SlurmHook against the real local cluster, over real SSH (sshd on 127.0.0.1, key auth, host keys checked)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import (
    NpaCancelFailed,
    NpaConnectionError,
    NpaHostKeyError,
    NpaRemoteError,
    NpaValidationError,
)
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.submit.staging import StagedFile
from npa_airflow.slurm.transport import ssh
from npa_airflow.slurm.transport.cancels import CancelRequest
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from tests.harness.remote_files import aput_files, aread_from

pytestmark = pytest.mark.integration


def _config(cluster, **overrides) -> SlurmConnectionConfig:
    values = {
        "conn_id": "slurm_test",
        "hosts": (("127.0.0.1", cluster.port),),
        "user": cluster.user,
        "key_file": cluster.key_file,
        "known_hosts": cluster.known_hosts,
    }
    values.update(overrides)
    return SlurmConnectionConfig(**values)


@pytest.fixture
def hook(slurm_cluster) -> SlurmHook:
    return SlurmHook("slurm_default")


@pytest.fixture
def workdir(slurm_cluster) -> str:
    return f"{slurm_cluster.shared}/tests/hook-{uuid.uuid4().hex[:10]}"


async def _wait_terminal(hook: SlurmHook, job_id: str, timeout: float = 90) -> object:
    """Until accounting has the final record (squeue alone knows no exit code; sacct can lag behind it); on a
    cluster without accounting, until slurmctld says the job ended (the hook adds its exit code)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = (await hook.ajob_states([job_id])).get(job_id)
        final = info is not None and (info.source == "sacct" or await hook.aaccounting() is False)
        if info is not None and info.state.is_terminal and final:
            return info
        await asyncio.sleep(1)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s")


async def _submit(hook: SlurmHook, workdir: str, body: str, *args: str) -> str:
    script = f"{workdir}/{uuid.uuid4().hex[:8]}.sbatch"
    result = await hook.astage_and_submit(
        [StagedFile(script, f"#!/bin/bash\n{body}\n".encode(), 0o700)],
        script,
        sbatch_args=["--partition=cpu", f"--output={workdir}/%j.out", "--time=2", *args],
    )
    return result.job_id


async def test_run_returns_output_and_exit_status(hook):
    ok = await hook.arun(["printf", "%s|", "a b", "$(whoami)"])
    assert ok.stdout == b"a b|$(whoami)|"  # arguments arrive as data, not shell code
    failed = await hook.arun("echo oops >&2; exit 7", check=False)
    assert (failed.returncode, failed.error_text) == (7, "oops")
    with pytest.raises(NpaRemoteError, match="exit 7"):
        await hook.arun("exit 7")


async def test_write_file_is_atomic_and_private(hook, workdir):
    path = f"{workdir}/secret.env"
    data = b"export HF_TOKEN=canary\n\x00\xff binary tail"
    await aput_files(hook, [StagedFile(path, data)])
    mode = await hook.arun(["stat", "-c", "%a %U", path])
    assert mode.text.split() == ["600", "npa"]
    back = await hook.arun(["cat", path])
    assert back.stdout == data


async def test_submit_complete_failed_and_batched_states(hook, workdir):
    ok = await _submit(hook, workdir, "echo hello")
    bad = await _submit(hook, workdir, "exit 7")
    ok_info = await _wait_terminal(hook, ok)
    bad_info = await _wait_terminal(hook, bad)
    assert (ok_info.state, ok_info.exit_code) == (JobState.COMPLETE, 0)
    assert (bad_info.state, bad_info.native_state, bad_info.exit_code) == (JobState.ERROR, "FAILED", 7)
    both = await hook.ajob_states([ok, bad, "999999"])
    assert set(both) == {ok, bad}  # one call answers for many ids; an unknown id is absent, not an error
    assert (await aread_from(hook, f"{workdir}/{ok}.out", 0))[0] == b"hello\n"


@pytest.mark.accounting("the end records ride in the sacct command")
async def test_state_query_looks_for_end_records_in_its_sacct_command(hook, workdir):
    """Real sacct, squeue and shell: a running job whose end record exists is asked about with squeue (still
    RUNNING: it stays so); a running job without one costs no squeue; an ended one is sacct's."""
    await hook.arun(["mkdir", "-p", f"{workdir}/done", f"{workdir}/early", f"{workdir}/quiet"])
    done = await _submit(hook, workdir, f"echo 0 > {workdir}/done/child_exit_code")
    early = await _submit(hook, workdir, f"echo 0 > {workdir}/early/child_exit_code; sleep 60")
    quiet = await _submit(hook, workdir, "sleep 60")
    await _wait_terminal(hook, done)
    records = {
        j: f"{workdir}/{name}/child_exit_code" for j, name in ((done, "done"), (early, "early"), (quiet, "quiet"))
    }
    for _ in range(60):
        if (await hook.apaths_exist([records[early]]))[records[early]]:
            states = await hook.ajob_states([early, quiet])
            if all(s.state is JobState.RUNNING for s in states.values()) and len(states) == 2:
                break
        await asyncio.sleep(1)
    query = await hook.aquery_jobs([done, early, quiet], end_records=records)
    assert query.states[done].state is JobState.COMPLETE and query.states[done].source == "sacct"
    assert query.states[early].state is JobState.RUNNING and query.states[quiet].state is JobState.RUNNING
    assert query.end_records_checked == {early} and query.ended_before_accounting == frozenset()
    await hook.acancel_many([CancelRequest(early), CancelRequest(quiet)])


async def test_cancel_and_cancel_again(hook, workdir):
    job = await _submit(hook, workdir, "sleep 120")
    await hook.acancel(job)
    info = await _wait_terminal(hook, job)
    assert info.state is JobState.CANCELED
    await hook.acancel(job)  # already finished counts as cancelled


async def test_many_cancels_in_one_batch_each_with_its_own_answer(hook, workdir):
    """on_kill of a whole DAG run (kill_batch.py): one scancel for every job, the markers written first, the
    sidecars shredded; a job that already ended is ENDED and an id nobody knows fails alone."""
    running = [await _submit(hook, workdir, "sleep 120") for _ in range(3)]
    done = await _submit(hook, workdir, "true")
    await _wait_terminal(hook, done)
    sidecars = [f"{workdir}/{j}.npa-secrets" for j in [*running, done]]
    await aput_files(hook, [StagedFile(path, b"TOKEN=x\n", 0o600) for path in sidecars])
    requests = [
        CancelRequest(job, f"{workdir}/{job}.sbatch.npa-cancelled", (sidecar,))
        for job, sidecar in zip([*running, done], sidecars, strict=True)
    ]
    unknown = CancelRequest("999999")
    outcomes = await hook.acancel_many([*requests, unknown])
    assert [outcomes[r] for r in requests] == ["cancelled"] * 3 + ["ended"]
    assert isinstance(outcomes[unknown], NpaCancelFailed) and "job 999999" in str(outcomes[unknown])
    for job in running:
        assert (await _wait_terminal(hook, job)).state is JobState.CANCELED
    exists = await hook.apaths_exist([*sidecars, *(r.marker or "" for r in requests)])
    assert [exists[p] for p in sidecars] == [False] * 4
    assert all(exists[r.marker or ""] for r in requests)


async def test_a_script_longer_than_one_argument_runs_through_stdin(hook, workdir):
    """Linux caps one argument at 128 KiB; the claims read of 1,000 jobs is longer (ssh.SCRIPT_ON_STDIN)."""
    lines = [f"printf '%s\\n' {i} >/dev/null" for i in range(7000)]
    script = "; ".join([*lines, "read -r x || echo 'stdin at EOF'", "echo done"])
    assert len(ssh.login_shell_command(script)) > ssh.MAX_COMMAND_BYTES
    result = await hook.arun(script)
    assert result.text == "stdin at EOF\ndone\n"


async def test_node_fail_is_seen_as_error(hook, workdir, cluster_admin):
    job = await _submit(hook, workdir, "sleep 120", "--nodelist=c2", "--no-requeue")
    for _ in range(30):
        info = (await hook.ajob_states([job])).get(job)
        if info is not None and info.state is JobState.RUNNING:
            break
        await asyncio.sleep(1)
    try:
        cluster_admin("scontrol update nodename=c2 state=down reason=npa-test")
        info = await _wait_terminal(hook, job)
    finally:
        cluster_admin("scontrol update nodename=c2 state=resume")
    assert (info.state, info.native_state) == (JobState.ERROR, "NODE_FAIL")


async def test_tail_log_returns_only_new_bytes(hook, workdir):
    path = f"{workdir}/grow.log"
    await aput_files(hook, [StagedFile(path, b"line1\n", 0o644)])
    data, offset = await aread_from(hook, path, 0)
    assert (data, offset) == (b"line1\n", 6)
    await hook.arun(f"printf 'line2\\n' >> {path}")
    data, offset = await aread_from(hook, path, offset)
    assert (data, offset) == (b"line2\n", 12)
    assert (await aread_from(hook, path, offset)) == (b"", 12)


async def test_paths_and_missing_inputs_refused_before_writing(hook, workdir):
    assert await hook.apaths_exist(["/etc/hostname", f"{workdir}/nope"]) == {
        "/etc/hostname": True,
        f"{workdir}/nope": False,
    }
    target = f"{workdir}/staged/job.sbatch"
    with pytest.raises(NpaValidationError, match="nope"):
        await hook.astage_and_submit([StagedFile(target, b"#!/bin/bash\n")], target, required_paths=[f"{workdir}/nope"])
    assert not await hook.apath_exists(f"{workdir}/staged")


async def test_find_jobs_by_exact_name(hook, workdir):
    name = f"npa-find-{uuid.uuid4().hex[:8]}"
    job = await _submit(hook, workdir, "sleep 30", f"--job-name={name}")
    other = await _submit(hook, workdir, "sleep 30", f"--job-name={name}-other")
    try:
        found = await hook.afind_jobs_by_name([name])
        assert [(i.job_id, i.job_name) for i in found] == [(job, name)]
    finally:
        await hook.acancel(job)
        await hook.acancel(other)


async def test_lookups_by_name_made_together_share_one_sacct_and_squeue_and_each_finds_its_own(hook, workdir):
    """A triggerer starting many tasks looks up each one's try names at once: one lookup on the cluster answers
    all of them (the 250 names of one caller go in two commands of each tool), each caller gets only its jobs."""
    base = f"npa-many-{uuid.uuid4().hex[:8]}"
    jobs = [await _submit(hook, workdir, "true", f"--job-name={base}-{i}", "--hold") for i in range(4)]
    try:
        asked = [[f"{base}-{i}", f"{base}-{i}-t2"] for i in range(4)]
        asked.append([f"{base}-absent-{i}" for i in range(250)] + [f"{base}-3"])
        hooks = [SlurmHook("slurm_default") for _ in asked]
        for each in hooks:  # each start has read its connection before it looks up: the lookups arrive together
            await each.aconfig()
        lookups = ssh.loop_pool().name_lookups
        calls_before = sum(c.calls for c in lookups.values())
        pairs = zip(hooks, asked, strict=True)
        answers = await asyncio.gather(*(each.afind_jobs_by_name(names) for each, names in pairs))
        assert sum(c.calls for c in lookups.values()) - calls_before == 1
        for i, found in enumerate(answers[:4]):
            assert [(info.job_id, info.job_name, info.native_state) for info in found] == [
                (jobs[i], f"{base}-{i}", "PENDING")
            ]
        assert [(info.job_id, info.job_name) for info in answers[4]] == [(jobs[3], f"{base}-3")]
    finally:
        for job in jobs:
            await hook.acancel(job)


async def test_submissions_made_together_share_one_session_and_each_gets_its_own_job(hook, workdir):
    """A triggerer starting many tasks submits them at once: they reach the login host in one session, each with
    its own script and secrets sidecar, and one refused (a missing input) leaves the others their jobs."""
    base = f"npa-batch-{uuid.uuid4().hex[:8]}"
    key = (await hook.aconfig()).pool_key

    def submit(i: int, required: tuple[str, ...] = ()):
        script = f"{workdir}/{base}-{i}.sbatch"
        files = [
            StagedFile(script, f"#!/bin/bash\necho {i}\n".encode(), 0o700),
            StagedFile(f"{workdir}/{base}-{i}.env", f"SECRET={i}-{base}\n".encode(), 0o600),
        ]
        args = ["--partition=cpu", f"--output={workdir}/%j.out", "--time=2", "--hold", f"--job-name={base}-{i}"]
        return hook.astage_and_submit(files, script, sbatch_args=args, required_paths=required)

    batches = ssh.loop_pool().submissions
    calls_before = batches[key].calls if key in batches else 0
    results = await asyncio.gather(
        *(submit(i) for i in range(5)), submit(5, (f"{workdir}/absent",)), return_exceptions=True
    )
    jobs = [r.job_id for r in results[:5] if not isinstance(r, BaseException)]
    try:
        assert batches[key].calls - calls_before == 1
        assert len(jobs) == 5, results
        assert isinstance(results[5], NpaValidationError) and "absent" in str(results[5])
        found = await hook.afind_jobs_by_name([f"{base}-{i}" for i in range(6)])
        assert sorted((info.job_name, info.job_id) for info in found) == [(f"{base}-{i}", jobs[i]) for i in range(5)]
        for i in range(5):
            data, _ = await aread_from(hook, f"{workdir}/{base}-{i}.env", 0)
            assert data == f"SECRET={i}-{base}\n".encode()
        assert not await hook.apath_exists(f"{workdir}/{base}-5.sbatch")
    finally:
        for job in jobs:
            await hook.acancel(job)


async def test_one_pooled_connection_per_loop(slurm_cluster):
    pool_before = ssh.loop_pool().connects
    hooks = [SlurmHook("slurm_default") for _ in range(5)]
    await asyncio.gather(*(h.arun(["true"]) for h in hooks for _ in range(4)))
    assert ssh.loop_pool().connects - pool_before == 1


async def test_unknown_host_key_is_refused(slurm_cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    hook = SlurmHook(config=_config(slurm_cluster, known_hosts=str(empty)))
    with pytest.raises(NpaHostKeyError, match="not trusted"):
        await hook.arun(["true"])


async def test_changed_host_key_is_refused(slurm_cluster, tmp_path):
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{slurm_cluster.port} {(tmp_path / 'other.pub').read_text()}")
    hook = SlurmHook(config=_config(slurm_cluster, known_hosts=str(wrong)))
    with pytest.raises(NpaHostKeyError):
        await hook.arun(["true"])


async def test_failover_to_second_login_host(slurm_cluster, capfd):
    dead = ("127.0.0.1", 1)  # nothing listens on port 1
    hook = SlurmHook(config=_config(slurm_cluster, hosts=(dead, ("127.0.0.1", slurm_cluster.port2))))
    result = await hook.arun(["true"])
    assert result.host == f"127.0.0.1:{slurm_cluster.port2}"
    out, err = capfd.readouterr()
    assert "Login host 127.0.0.1:1 unreachable" in out + err
    assert f"failing over to 127.0.0.1:{slurm_cluster.port2}" in out + err


async def test_no_reachable_host_is_a_clear_error(slurm_cluster):
    hook = SlurmHook(config=_config(slurm_cluster, hosts=(("127.0.0.1", 1),)), connect_attempts=1)
    with pytest.raises(NpaConnectionError, match="no login host"):
        await hook.arun(["true"])


def test_sync_facade_shares_one_connection(slurm_cluster):
    hook = SlurmHook("slurm_default")
    assert hook.run(["echo", "sync"]).text == "sync\n"
    assert hook.path_exists("/etc/hostname")
    assert "cpu" in hook.partitions()
