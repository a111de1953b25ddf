"""The SSH transport: login host failover and the rounds of connect retries (no sshd needed: closed ports)."""

from __future__ import annotations

import logging

import pytest

from npa_airflow.common.retry import Backoff
from npa_airflow.exceptions import NpaConnectionError
from npa_airflow.slurm.transport import ssh
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

LOG = logging.getLogger("test.ssh")


def _config(*ports: int) -> SlurmConnectionConfig:
    return SlurmConnectionConfig(
        conn_id="slurm_x",
        hosts=tuple(("127.0.0.1", p) for p in ports),
        user="npa",
        insecure_skip_host_key_check=True,
        connect_timeout=2,
    )


@pytest.fixture
def connects(monkeypatch) -> list[tuple[str, int]]:
    """Every connect attempt, refused at once (as by a closed port)."""
    seen: list[tuple[str, int]] = []

    async def refuse(host, port, **options):
        seen.append((host, port))
        raise ConnectionRefusedError(f"Connect call failed ({host!r}, {port})")

    monkeypatch.setattr(ssh.asyncssh, "connect", refuse)
    monkeypatch.setattr(ssh, "CONNECT_BACKOFF", Backoff(base=0.0, cap=0.0, jitter=0.0))
    return seen


@pytest.mark.parametrize("attempts", [1, 2, 3])
async def test_every_login_host_is_tried_in_order_in_each_round(connects, attempts):
    with pytest.raises(NpaConnectionError, match="no login host of slurm connection 'slurm_x'") as raised:
        await ssh.open_connection(_config(1, 2), attempts, LOG)
    assert connects == [("127.0.0.1", 1), ("127.0.0.1", 2)] * attempts
    assert str(raised.value).count("Connect call failed") == 2  # the last round's errors, one per host


def test_short_command_keeps_the_first_line_within_the_limit():
    assert ssh.short_command("sbatch x\nsecond line") == "sbatch x"
    assert ssh.short_command("a" * 200, limit=10) == "a" * 10 + "..."
    assert ssh.short_command("   ") == ""
