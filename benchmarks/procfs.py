"""Pure readers of Linux /proc text: one process's stat line, the kernel's TCP table, MemAvailable.

The triggerer benchmark samples these once a tick (benchmarks/sampler.py); everything here parses text it is
given, so it is unit-tested on captured samples.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TCP_ESTABLISHED = "01"
_SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the benchmark uses (CPU in clock ticks, RSS in pages)."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    utime: int
    stime: int
    rss_pages: int

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime


def parse_proc_stat(text: str) -> ProcStat:
    """One /proc/<pid>/stat line. The command name sits in parentheses and may itself hold spaces or ')'."""
    head, sep, tail = text.rpartition(")")
    if not sep or " (" not in head:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    pid_text, comm = head.split(" (", 1)
    fields = tail.split()
    # tail starts at field 3 (state); utime/stime are fields 14/15 and rss is field 24 (1-based, man 5 proc)
    if len(fields) < 22:
        raise ValueError(f"short /proc/<pid>/stat line: {text[:80]!r}")
    return ProcStat(
        pid=int(pid_text),
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        utime=int(fields[11]),
        stime=int(fields[12]),
        rss_pages=int(fields[21]),
    )


@dataclass(frozen=True)
class TcpSocket:
    """One row of /proc/net/tcp: IPv4 addresses as dotted quads, ports as ints, state as the kernel's hex."""

    local_addr: str
    local_port: int
    remote_addr: str
    remote_port: int
    state: str
    inode: int


def _endpoint(hex_text: str) -> tuple[str, int]:
    addr, port = hex_text.split(":")
    octets = bytes.fromhex(addr)[::-1]  # the kernel prints the address in host (little-endian) order
    return ".".join(str(b) for b in octets), int(port, 16)


def parse_proc_net_tcp(text: str) -> list[TcpSocket]:
    """The rows of /proc/net/tcp (the header line is skipped)."""
    rows = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10:
            continue
        local, remote = _endpoint(parts[1]), _endpoint(parts[2])
        rows.append(TcpSocket(local[0], local[1], remote[0], remote[1], parts[3].upper(), int(parts[9])))
    return rows


def established_to(sockets: Iterable[TcpSocket], ports: Iterable[int]) -> list[TcpSocket]:
    """Client-side ESTABLISHED sockets whose far end is one of `ports` (on loopback both ends are listed:
    the server side has the port locally and is left out)."""
    wanted = set(ports)
    return [s for s in sockets if s.state == TCP_ESTABLISHED and s.remote_port in wanted]


def socket_inode(link: str) -> int | None:
    """The inode of a /proc/<pid>/fd/<n> link that names a socket ("socket:[1234]"), else None."""
    match = _SOCKET_LINK.match(link)
    return int(match.group(1)) if match else None


def process_tree(procs: Iterable[ProcStat], root: int) -> list[ProcStat]:
    """The processes of `root`'s process group and every descendant of `root` (a child may start its own group)."""
    procs = list(procs)
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    members, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in members:
                members.add(child)
                stack.append(child)
    return [p for p in procs if p.pid in members or p.pgrp == root]


def mem_available_kib(meminfo: str) -> int | None:
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return None


def cpu_ticks_between(before: Mapping[int, int], after: Mapping[int, int]) -> int:
    """CPU ticks a set of processes used between two samples ({pid: utime+stime}).

    A pid only in `after` started in between and counts from zero; a pid only in `before` exited and its last
    reading is all we know of it (its final ticks go to the parent's cutime, which is not summed here).
    A pid whose count went down was reused by a new process: it also counts from zero.
    """
    total = 0
    for pid, ticks in after.items():
        previous = before.get(pid, 0)
        total += ticks - previous if ticks >= previous else ticks
    return total
