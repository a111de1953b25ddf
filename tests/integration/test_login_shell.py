"""The hook's commands for a cluster user whose login shell is tcsh (sshd runs every command with `$SHELL -c`).

The cluster user's shell is switched to tcsh for the test and restored in a `finally` (least invasive: no second
user, Slurm association or authorized key to create). A fresh event loop means a fresh SSH connection, so sshd
reads the new shell. A raw `ssh` control first proves the login shell really is tcsh (a bash-only line fails).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import Iterator

import pytest

from npa_airflow.common.ownership import Claim
from npa_airflow.common.states import JobState
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.submit.preflight import PreflightRequest, build_preflight_command, parse_preflight
from npa_airflow.slurm.submit.staging import StagedFile
from npa_airflow.slurm.watch.poller import SlurmPoller, offsets_file_for

pytestmark = pytest.mark.integration

TCSH = shutil.which("tcsh")


@pytest.fixture
def tcsh_login(slurm_cluster, cluster_admin) -> Iterator[None]:
    """The cluster user's login shell is tcsh while the test runs; the original shell comes back afterwards."""
    if TCSH is None:
        pytest.skip("tcsh is not installed on this machine (dev/setup installs it): cannot switch the login shell")
    if not slurm_cluster.root and not slurm_cluster.accounting:
        pytest.skip(
            "the bed without accounting shares user npa with the default bed (this machine's Slurm): switching its "
            "login shell would reach that bed's logins too"
        )
    user = slurm_cluster.user
    original = cluster_admin(f"getent passwd {user} | cut -d: -f7").stdout.strip()
    assert original, f"no passwd entry for {user}"
    cluster_admin(f"usermod --shell {TCSH} {user}")
    try:
        yield
    finally:
        cluster_admin(f"usermod --shell {original} {user}")


def test_every_hook_command_works_when_the_login_shell_is_tcsh(slurm_cluster, cluster_ssh, tcsh_login):
    control = cluster_ssh("npa_x=1; echo $npa_x")  # bash syntax straight to the login shell
    assert control.returncode != 0, f"the login shell is not tcsh: {control.stdout!r}"
    workdir = f"{slurm_cluster.shared}/tests/tcsh-{uuid.uuid4().hex[:8]}-it's-!x"
    out = f"{workdir}/job.out"
    body = "#!/bin/bash\nprintf 'line %s!\\n' 1 2 3\n"

    async def scenario() -> None:
        hook = SlurmHook("slurm_default")  # a new loop: a new connection, made with the tcsh login
        script = f"{workdir}/job.sbatch"
        submitted = await hook.astage_and_submit(
            [StagedFile(script, body.encode(), 0o700)],
            script,
            sbatch_args=["--partition=cpu", f"--output={out}", "--time=2", "--cpus-per-task=1"],
            required_paths=[slurm_cluster.shared],
        )
        claim, claim_file = Claim.new(1), f"{out}.npa-owner-tcsh"
        poller = SlurmPoller("slurm_default", lambda _: hook, autostart=False)
        reg = poller.register(
            submitted.job_id, log_offsets=[(out, 0)], offsets_file=offsets_file_for(out), claim=claim,
            claim_file=claim_file,
        )  # fmt: skip
        data, done = b"", False
        for _ in range(90):
            await poller.cycle()
            while not reg.queue.empty():
                update = reg.queue.get_nowait()
                for chunk in update.chunks:
                    data += chunk.data
                    reg.commit(chunk.path, chunk.offset)
                done = done or (update.state.is_terminal and update.logs_drained)
                assert update.state is not JobState.ERROR, update
            if done:
                break
            await asyncio.sleep(1)
        assert done and data == b"line 1!\nline 2!\nline 3!\n"
        await poller.flush_offsets(reg)
        assert await poller.channel.kills.read_claim(claim_file) == claim  # written by the claims command, read back
        saved = await hook.arun(["cat", offsets_file_for(out)])
        assert json.loads(saved.text) == {out: len(data)}  # the guarded offsets write ran
        [tail] = await hook.atail_logs([(out, 7)])
        assert tail.data == data[7:]
        request = PreflightRequest(
            check_pyxis=False, check_enroot=False, writable_dirs=(("results_root", slurm_cluster.shared),),
            dataset_paths=(workdir,), partitions=("cpu",),
        )  # fmt: skip
        result = await hook.arun(build_preflight_command(request), check=False, timeout=60)
        assert result.returncode == 0, result.error_text
        report = parse_preflight(result.text, request)
        assert report.ok, [str(f) for f in report.failures]
        await hook.arun(["rm", "-rf", "--", workdir])

    asyncio.run(scenario())
