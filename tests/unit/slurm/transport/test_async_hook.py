"""AsyncSlurmHook.arun: when a command is run again after its connection died, and when it never is; the exact
string it sends; and how astage_and_submit classifies a session whose stdin the remote side closed unread."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shlex
import shutil
import subprocess
from types import SimpleNamespace

import asyncssh
import pytest

from npa_airflow.common.ownership import Claim
from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaConnectionError, NpaRemoteError, NpaValidationError
from npa_airflow.slurm.commands.offsets import (
    build_commit_offsets,
    build_read_claims,
    build_read_offsets,
    build_write_claims,
    parse_read_claims,
    parse_read_offsets,
)
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.submit.preflight import PreflightRequest, build_preflight_command
from npa_airflow.slurm.submit.staging import SBATCH_BEGIN, StagedFile
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from npa_airflow.slurm.transport.ssh import MAX_COMMAND_BYTES, SCRIPT_ON_STDIN, login_shell_command

CONFIG = SlurmConnectionConfig(conn_id="slurm_x", hosts=(("127.0.0.1", 1),), user="npa")


class DyingConnection:
    """Every command fails with ``error``; counts how often it was started and how often dropped."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.runs = 0
        self.drops = 0

    async def run(self, *args, **kwargs):
        self.runs += 1
        raise self.error

    async def create_process(self, *args, **kwargs):
        return await self.run(*args, **kwargs)


def hook_on(conn: DyingConnection) -> SlurmHook:
    hook = SlurmHook(config=CONFIG)

    async def connection():
        return conn, "login1:22", asyncio.Semaphore(1)

    async def drop(dead):
        dead.drops += 1

    hook._connection = connection  # type: ignore[method-assign]
    hook._drop = drop  # type: ignore[method-assign]
    return hook


@pytest.mark.parametrize(
    ("error", "idempotent", "runs"),
    [
        (asyncssh.ChannelOpenError(1, "no session"), False, 2),  # never started: always safe to run again
        (ConnectionResetError("reset"), True, 2),
        (ConnectionResetError("reset"), False, 1),  # sbatch: may have run, never repeated
    ],
)
async def test_a_dead_connection_is_replaced_once_and_only_for_safe_commands(error, idempotent, runs):
    conn = DyingConnection(error)
    with pytest.raises(NpaConnectionError, match="login1:22"):
        await hook_on(conn).arun("sbatch job.sh", idempotent=idempotent)
    assert (conn.runs, conn.drops) == (runs, runs)


class ShellConnection:
    """Records each exact command string and stdin; with ``shell``, runs it as sshd would: ``<shell> -c <command>``."""

    def __init__(self, shell: str | None = None, path: str | None = None) -> None:
        self.shell = shell
        self.env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}"} if path else None
        self.sent: list[tuple[str, bytes | None]] = []

    async def run(self, command, *, input=None, **kwargs):
        self.sent.append((command, input))
        if self.shell is None:
            return SimpleNamespace(stdout=b"", stderr=b"", exit_status=0)
        done = subprocess.run([self.shell, "-c", command], input=input, capture_output=True, env=self.env)
        return SimpleNamespace(stdout=done.stdout, stderr=done.stderr, exit_status=done.returncode)

    async def create_process(self, command, **kwargs):
        """asyncssh's session: stdin is gathered until EOF, then the command runs with it."""
        connection, written = self, bytearray()

        class Session:
            stdin = SimpleNamespace(write=written.extend, write_eof=lambda: None)

            async def wait(self, check: bool = False, timeout: float | None = None):
                return await connection.run(command, input=bytes(written) if written else None)

            def close(self) -> None:
                pass

        return Session()


def _script_of(sent: str) -> str:
    match = re.fullmatch(r"exec bash -c 'eval \"\$\(echo ([A-Za-z0-9+/=]*) \| base64 -d\)\"'", sent)
    assert match, sent
    return base64.b64decode(match.group(1)).decode()


@pytest.mark.parametrize(
    ("argv", "script"),
    [
        (["sacct", "-j", "1,2"], "sacct -j 1,2"),
        (["scancel", "a b!c"], "scancel 'a b!c'"),
        ("set -u\nprintf '%s\\n' \"$HOME\"", "set -u\nprintf '%s\\n' \"$HOME\""),
    ],
)
async def test_every_command_is_sent_as_bash_of_the_base64_script(argv, script):
    conn = ShellConnection()
    await hook_on(conn).arun(argv)  # type: ignore[arg-type]
    [(sent, _)] = conn.sent
    assert sent == "exec bash -c 'eval \"$(echo " + base64.b64encode(script.encode()).decode() + " | base64 -d)\"'"
    assert _script_of(sent) == script


SHELLS = [s for s in ("bash", "sh", "tcsh", "csh", "zsh") if shutil.which(s)]


@pytest.mark.parametrize("shell", SHELLS)
def test_the_sent_string_runs_the_script_under_any_login_shell(shell, tmp_path):
    """What sshd does with the command (`$SHELL -c <command>`), with a script tcsh alone could not parse."""
    marker = tmp_path / "ran"
    script = (
        "set -u\n"
        "IFS= read -r line\n"
        f"printf '%s|%s\\n' \"$line\" 'a!b $HOME `x`' > {shlex.quote(str(marker))}\n"
        "{ echo multi; } && exit 7"
    )
    done = subprocess.run([shell, "-c", login_shell_command(script)], input=b"first line\n", capture_output=True)
    assert done.returncode == 7, done.stderr
    assert marker.read_text() == "first line|a!b $HOME `x`\n"
    assert done.stdout == b"multi\n"


def _tcsh() -> str:
    if not shutil.which("tcsh"):
        pytest.skip("tcsh is not installed (dev/setup installs it)")
    return "tcsh"


def test_tcsh_cannot_run_a_plainly_quoted_multiline_script():
    """Why the wrapper encodes: `bash -c <shlex.quote(script)>` fails in tcsh (newline, `!` in single quotes)."""
    plain = "bash -c " + shlex.quote("echo one\necho 'a!b'")
    assert subprocess.run([_tcsh(), "-c", plain], capture_output=True).returncode != 0


async def test_the_hooks_commands_work_for_a_tcsh_login_user(tmp_path):
    """Stage + submit, tail, paths, claims/offsets and preflight through the hook, with tcsh as the login shell."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "sbatch").write_text('#!/bin/bash\necho "4242;c1"\n')
    (fake_bin / "sbatch").chmod(0o755)
    conn = ShellConnection(_tcsh(), path=str(fake_bin))
    hook = hook_on(conn)  # type: ignore[arg-type]
    jobdir = tmp_path / "job it's $(x) !1"
    script = jobdir / "a.sbatch"
    submitted = await hook.astage_and_submit(
        [StagedFile(str(script), b"#!/bin/bash\necho 'hi!'\n")], str(script), required_paths=[str(tmp_path)]
    )
    assert submitted.job_id == "4242" and script.read_bytes() == b"#!/bin/bash\necho 'hi!'\n"
    [chunk] = await hook.atail_logs([(str(script), 3)])
    assert chunk.data == b"bin/bash\necho 'hi!'\n"
    assert await hook.apaths_exist([str(script), str(jobdir / "nope")]) == {
        str(script): True,
        str(jobdir / "nope"): False,
    }
    claim_file, offsets = str(jobdir / "o.npa-owner-x"), str(jobdir / "o.npa-offsets")
    claim = Claim.new(1)
    await hook.arun(build_write_claims([(claim_file, claim)]))
    await hook.arun(build_commit_offsets([(offsets, '{"a": 5}')], {offsets: (claim_file, claim)}))
    read = await hook.arun(build_read_claims([claim_file]) + "; " + build_read_offsets([offsets]))
    first, rest = read.stdout.split(b"\n", 1)
    assert parse_read_claims(first, [claim_file]) == {claim_file: claim}
    assert parse_read_offsets(rest, [offsets]) == {offsets: {"a": 5}}
    request = PreflightRequest(tools=("bash",), check_pyxis=False, check_enroot=False, dataset_paths=(str(jobdir),))
    done = await hook.arun(build_preflight_command(request), check=False)
    assert "NPA_PF" in done.text and done.returncode == 0, done.stderr


async def test_a_script_too_long_for_one_argument_travels_as_stdin(tmp_path):
    """Linux caps one argument at 128 KiB: a longer script (a batch over 1,000 jobs) is sent as stdin, and runs
    under every login shell; with stdin of its own it is refused before anything is sent."""
    conn = ShellConnection(shell=_tcsh_or_sh())
    hook = hook_on(conn)  # type: ignore[arg-type]
    fits = "x" * (MAX_COMMAND_BYTES * 3 // 4 - 64)
    await hook.arun(["printf", fits])
    assert conn.sent[-1][1] is None and len(conn.sent[-1][0]) <= MAX_COMMAND_BYTES
    long = "; ".join(f"printf '%s\\n' {i} >/dev/null" for i in range(8000)) + "; read -r x; printf 'end %s' \"$x\""
    assert len(login_shell_command(long)) > MAX_COMMAND_BYTES
    done = await hook.arun(long)
    assert conn.sent[-1] == (SCRIPT_ON_STDIN, long.encode())
    assert done.stdout == b"end " and done.returncode == 0, done.stderr  # the script's own reads see EOF
    with pytest.raises(NpaValidationError, match="too long"):
        await hook.arun(long, stdin=b"data")
    assert len(conn.sent) == 2


def _tcsh_or_sh() -> str:
    return "tcsh" if shutil.which("tcsh") else "sh"


class _Stdin:
    def __init__(self, closed: bool) -> None:
        self.closed = closed

    def write(self, data: bytes) -> None:
        if self.closed:
            raise BrokenPipeError("Channel not open for sending")  # asyncssh's error, word for word

    def write_eof(self) -> None:
        pass


class _Done:
    def __init__(self, stdout: bytes, exit_status: int | None) -> None:
        self.stdout, self.stderr, self.exit_status = stdout, b"", exit_status


class _Process:
    def __init__(self, closed: bool, stdout: bytes, exit_status: int | None, lost: Exception | None) -> None:
        self.stdin = _Stdin(closed)
        self.done = _Done(stdout, exit_status)
        self.lost = lost

    async def wait(self, check: bool = False, timeout: float | None = None) -> _Done:
        if self.lost is not None:
            raise self.lost
        return self.done

    def close(self) -> None:
        pass


class StagingConnection(DyingConnection):
    """One session whose stdin may already be closed when written (the script exited first), like asyncssh's."""

    def __init__(self, *, closed: bool, stdout: bytes = b"", exit_status: int | None, lost: Exception | None = None):
        super().__init__(RuntimeError("unused"))
        self.process = _Process(closed, stdout, exit_status, lost)

    async def create_process(self, *args, **kwargs):
        self.runs += 1
        return self.process

    async def run(self, *args, input=None, **kwargs):  # asyncssh: create_process, write input, wait
        process = await self.create_process()
        process.stdin.write(input)
        return await process.wait()


def _stage(conn: StagingConnection):
    files = [StagedFile("/shared/big.bin", b"x" * (1 << 20)), StagedFile("/shared/job.sbatch", b"#!/bin/bash\n")]
    return hook_on(conn).stage_and_submit(files, "/shared/job.sbatch", required_paths=["/shared/no-such"])


@pytest.mark.parametrize("exit_status", [3, None])  # None: the status was lost, the output says why
def test_missing_inputs_under_a_closed_stdin_are_the_named_refusal(exit_status):
    conn = StagingConnection(closed=True, stdout=b"NPA_MISSING /shared/no-such\n", exit_status=exit_status)
    with pytest.raises(NpaValidationError, match=r"required inputs do not exist.*/shared/no-such"):
        _stage(conn)
    assert conn.runs == 1


@pytest.mark.parametrize(
    ("stdout", "exit_status", "lost"),
    [
        (b"", None, None),  # stdin closed unread and no sbatch marker: the script ended before sbatch
        (b"", 4, None),
        (b"", None, ConnectionResetError("reset")),  # stdin closed unread, then the connection died
    ],
)
def test_a_closed_stdin_before_sbatch_is_a_definite_refusal(stdout, exit_status, lost):
    conn = StagingConnection(closed=True, stdout=stdout, exit_status=exit_status, lost=lost)
    with pytest.raises(NpaRemoteError) as caught:
        _stage(conn)
    assert not isinstance(caught.value, NpaAmbiguousSubmission)
    assert conn.runs == 1


@pytest.mark.parametrize(
    ("stdout", "lost"),
    [
        (f"{SBATCH_BEGIN}\n".encode(), None),  # sbatch started, its outcome never arrived
        (b"", ConnectionResetError("reset")),  # stdin was accepted: sbatch may have run
    ],
)
def test_a_session_lost_after_sbatch_could_run_stays_ambiguous(stdout, lost):
    conn = StagingConnection(closed=False, stdout=stdout, exit_status=None, lost=lost)
    with pytest.raises(NpaAmbiguousSubmission):
        _stage(conn)


def _frame(index: int, rc: int, out: bytes) -> bytes:
    return f"NPA-BATCH {index} {rc}\n".encode() + base64.b64encode(out) + b"\n\n"


def _submit_two_together(conn: StagingConnection) -> list:
    """Two submissions made at once on one loop: they go in one batch (one session of ``conn``)."""
    hook = hook_on(conn)

    async def both():
        submissions = [
            hook.astage_and_submit([StagedFile(f"/shared/{i}.sbatch", b"#!/bin/bash\n")], f"/shared/{i}.sbatch")
            for i in range(2)
        ]
        return await asyncio.gather(*submissions, return_exceptions=True)

    return hook._sync(both())


@pytest.mark.parametrize(
    ("closed", "stdout", "exit_status", "lost"),
    [
        (False, b"", None, ConnectionResetError("reset")),  # lost while the batch ran
        (True, b"", None, ConnectionResetError("reset")),  # stdin refused: alone a refusal, in a batch unknown which
        (False, b"NPA-BATCH 0 0\n%%%\n\n", 0, None),  # a garbled frame
    ],
)
def test_a_batch_that_gave_no_whole_answer_leaves_each_of_its_submissions_ambiguous(closed, stdout, exit_status, lost):
    conn = StagingConnection(closed=closed, stdout=stdout, exit_status=exit_status, lost=lost)
    answers = _submit_two_together(conn)
    assert conn.runs == 1
    assert [type(answer) for answer in answers] == [NpaAmbiguousSubmission] * 2, answers


def test_a_batch_cut_after_its_first_answer_gives_that_answer_and_leaves_the_next_ambiguous():
    first = f"{SBATCH_BEGIN}\n4242\nNPA_SBATCH_RC 0\n".encode()
    conn = StagingConnection(closed=False, stdout=_frame(0, 0, first) + b"NPA-BATCH 1", exit_status=None)
    answers = _submit_two_together(conn)
    assert conn.runs == 1
    assert answers[0].job_id == "4242"
    assert isinstance(answers[1], NpaAmbiguousSubmission) and "/shared/1.sbatch" in str(answers[1])
