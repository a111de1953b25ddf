"""AsyncSlurmHook.arun: when a command is run again after its connection died, and when it never is; and how
astage_and_submit classifies a session whose stdin the remote side closed unread."""

from __future__ import annotations

import asyncio

import asyncssh
import pytest

from npa_airflow.exceptions import NpaAmbiguousSubmission, NpaConnectionError, NpaRemoteError, NpaValidationError
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.staging import SBATCH_BEGIN, StagedFile

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
