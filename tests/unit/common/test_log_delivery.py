"""A trigger's event waits until its log lines have left the log socket (common/log_delivery.py), on real sockets."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from typing import Any

import pytest
import structlog

from npa_airflow.common import log_delivery
from npa_airflow.common.log_delivery import log_socket_fd, unread_bytes, until_log_lines_read
from tests.supervisor_double import run_for_task_instance
from tests.unit.common.test_owned_trigger import JobTrigger


class _Factory:
    """The shape of Airflow's structlog logger factory: the stream its loggers write to, as `io`."""

    def __init__(self, io: Any) -> None:
        self.io = io

    def __call__(self, *args: Any) -> structlog.BytesLogger:
        return structlog.BytesLogger(self.io)


@pytest.fixture
def log_socket():
    """This process's log lines go to one end of a socket pair, as a triggerer's runner's go to its supervisor."""
    runner_end, supervisor_end = socket.socketpair()
    saved = structlog.get_config()
    stream = runner_end.makefile("wb", buffering=0)
    structlog.configure(logger_factory=_Factory(stream))
    try:
        yield runner_end, supervisor_end
    finally:
        structlog.configure(**saved)
        stream.close()
        runner_end.close()
        supervisor_end.close()


def _read_all(sock: socket.socket, size: int) -> int:
    got = 0
    while got < size:
        got += len(sock.recv(65536))
    return got


def test_the_log_socket_is_found_through_the_logger_factory_and_counts_what_the_peer_has_not_read(log_socket):
    runner_end, supervisor_end = log_socket
    assert log_socket_fd() == runner_end.fileno()
    runner_end.sendall(b"x" * 10_000)
    assert unread_bytes(runner_end.fileno()) >= 10_000
    _read_all(supervisor_end, 10_000)
    assert unread_bytes(runner_end.fileno()) == 0


def test_a_log_stream_that_is_not_a_socket_is_not_waited_for(tmp_path):
    saved = structlog.get_config()
    with open(tmp_path / "log", "wb") as stream:
        structlog.configure(logger_factory=_Factory(stream))
        try:
            assert log_socket_fd() is None
            assert asyncio.run(until_log_lines_read(timeout=5)) == 0.0
        finally:
            structlog.configure(**saved)


async def test_the_wait_ends_when_the_peer_has_read_the_lines(log_socket):
    runner_end, supervisor_end = log_socket
    runner_end.sendall(b"a line\n" * 2_000)

    async def supervisor_reads_later() -> float:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(_read_all, supervisor_end, 14_000)
        return time.monotonic()

    reader = asyncio.create_task(supervisor_reads_later())
    waited = await until_log_lines_read(timeout=5)
    read_at = await reader
    assert 0.3 <= waited < 5 and time.monotonic() - read_at < 0.5


async def test_the_wait_is_bounded_when_nobody_reads(log_socket):
    log_socket[0].sendall(b"unread\n")
    assert 0.2 <= await until_log_lines_read(timeout=0.2) < 1


async def test_a_trigger_fires_its_event_once_its_lines_are_read(log_socket):
    runner_end, supervisor_end = log_socket
    trigger = run_for_task_instance(JobTrigger(), try_number=1)
    runner_end.sendall(b"the job's last line\n" * 500)
    events = trigger.run()
    first = asyncio.create_task(events.__anext__())
    await asyncio.sleep(0.3)
    assert not first.done()  # the lines wait in the socket: no event yet
    await asyncio.to_thread(_read_all, supervisor_end, 10_000)
    event = await asyncio.wait_for(first, 2)
    assert event.payload["status"] == "success"


async def test_after_its_event_a_trigger_ends_once_airflow_s_line_about_it_is_read(log_socket):
    runner_end, supervisor_end = log_socket
    events = run_for_task_instance(JobTrigger(), try_number=1).run()
    await events.__anext__()
    runner_end.sendall(b"Trigger fired event\n" * 100)  # what Airflow writes about the event, before resuming it
    end = asyncio.create_task(events.__anext__())
    await asyncio.sleep(0.3)
    assert not end.done()
    await asyncio.to_thread(_read_all, supervisor_end, 2_000)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(end, 2)


async def test_lines_written_after_the_wait_began_do_not_hold_it(monkeypatch):
    """Other triggers keep writing while the peer reads, so the queue never empties: the wait ends once the drops
    between its checks add up to what was queued when it began (the peer has read at least that much)."""
    queue = iter([1000, 1500, 1200, 700, 900, 600, 800, 800])
    checks: list[int] = []

    def unread(fd: int) -> int:
        checks.append(next(queue))
        return checks[-1]

    monkeypatch.setattr(log_delivery, "unread_bytes", unread)
    await until_log_lines_read(timeout=5, fd=99)
    assert checks == [1000, 1500, 1200, 700, 900, 600]  # drops 300 + 500 + 300 >= 1000


async def test_a_queue_that_only_grows_holds_the_wait_to_its_bound(monkeypatch):
    growing = itertools.count(1000, 10)
    monkeypatch.setattr(log_delivery, "unread_bytes", lambda fd: next(growing))
    assert 0.2 <= await until_log_lines_read(timeout=0.2, fd=99) < 1
