"""AsyncSlurmHook.arun: when a command is run again after its connection died, and when it never is."""

from __future__ import annotations

import asyncio

import asyncssh
import pytest

from npa_airflow.exceptions import NpaConnectionError
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.hook import SlurmHook

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
