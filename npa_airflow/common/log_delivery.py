"""A trigger's last lines reach its task's log before the trigger ends.

Airflow 3.3.2's triggerer supervisor reads its runner's log socket 4 KiB per turn of its loop, and closes a
trigger's log file as soon as the runner reports the trigger finished, a message that travels on another socket.
Lines still queued on the log socket then land in the triggerer's own log instead of the task's: a job's last
lines of output and its end, the lines an on-call operator reads first. So a trigger, before it fires the event
that ends it, waits (bounded) until the supervisor has read every byte this process has queued on that socket,
and once more after it, for the line Airflow writes about the event.

The queue is read with SIOCOUTQ: on a Unix socket it counts what was sent and not yet read by the peer. Where log
lines go to a file or a terminal (a trigger run outside Airflow's supervisors, a test) there is nothing to wait for.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
import struct
import termios
import time

import structlog

# The bound. On the test bed a triggerer's supervisor serving its first trigger of a `start_from_trigger` task read
# nothing for 2 s; one further behind may still lose lines. 1,000 jobs that end together keep a triggerer's
# supervisor reading their lines for seconds: the bound is also what each of their events may wait.
LOG_DELIVERY_SECONDS = 3.0
# After the event, for Airflow's own line about it: shorter, well before the supervisor, having stored the event,
# cancels the trigger (which Airflow would log as a user's action).
AFTER_EVENT_SECONDS = 1.0
_CHECK_EVERY = 0.05  # a thousand waiters at once wake 20,000 times a second: no finer


def log_socket_fd() -> int | None:
    """The socket this process's structured log lines go to, or None (a file, a terminal, no such setup)."""
    stream = getattr(structlog.get_config().get("logger_factory"), "io", None)
    try:
        fd = stream.fileno()  # type: ignore[union-attr]
        return fd if stat.S_ISSOCK(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None


def unread_bytes(fd: int) -> int:
    """Bytes this process has sent on socket `fd` that its peer has not read yet (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]


async def until_log_lines_read(timeout: float = LOG_DELIVERY_SECONDS, fd: int | None = None) -> float:
    """Wait until the log lines written so far have been read by the process that files them (at most `timeout`
    seconds); the seconds waited.

    The peer reads in order, so the lines are read once it has read as much as was queued when the wait began.
    Other triggers keep writing meanwhile (a thousand jobs that end together): the queue may never be empty,
    so what the peer has read is counted too, as the sum of the queue's drops between two checks (each drop is
    what it read less what was written meanwhile: never more than it read)."""
    fd = log_socket_fd() if fd is None else fd
    started = time.monotonic()
    if fd is None:
        return 0.0
    try:
        ahead = last = unread_bytes(fd)
    except OSError:
        return 0.0
    read_at_least = 0
    while last > 0 and read_at_least < ahead and time.monotonic() - started < timeout:
        await asyncio.sleep(_CHECK_EVERY)
        try:
            pending = unread_bytes(fd)
        except OSError:
            break
        read_at_least += max(0, last - pending)
        last = pending
    return time.monotonic() - started
