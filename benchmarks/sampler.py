"""A background sampler of one machine's view of the benchmark: the triggerer's CPU, memory and SSH connections,
the login hosts' sshd and sbatch processes, and the memory left.

Every tick it reads /proc once: each process's stat line (CPU, RSS, process group), /proc/net/tcp (client-side
connections to the login hosts' ports) and the triggerer's file descriptors (which of those sockets are its
own). Windows are cut out of the series afterwards (`summarize`), so the phases of a run need no coordination
with the thread beyond their start and end times.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from benchmarks.procfs import (
    ProcStat,
    cpu_ticks_between,
    established_to,
    mem_available_kib,
    parse_proc_net_tcp,
    parse_proc_stat,
    process_tree,
    socket_inode,
)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class Sample:
    t: float
    login_conns: int  # client-side ESTABLISHED connections to the login hosts, any process on this machine
    triggerer_conns: int  # ... of them held by the measured triggerer's processes
    triggerer_ports: frozenset[int]  # their local ports (how sshd's log names them)
    triggerer_cpu: dict[int, int]  # {pid: utime+stime ticks} of the triggerer's processes (group + descendants)
    triggerer_rss_kib: int
    sshd_procs: int  # per-connection sshd processes (the listeners excluded)
    sshd_rss_kib: int
    sbatch_procs: int
    mem_available_kib: int | None
    load1: float  # the machine's 1-minute load average


@dataclass(frozen=True)
class WindowStats:
    seconds: float
    samples: int
    login_conns_peak: int
    login_conns_median: float
    triggerer_conns_peak: int
    triggerer_conns_median: float
    triggerer_cpu_s_per_min: float | None
    triggerer_rss_peak_mib: float
    sshd_procs_peak: int
    sshd_rss_peak_mib: float
    sbatch_procs_peak: int
    mem_available_min_mib: float | None
    load1_median: float


def take_sample(triggerer_pgid: int | None, login_ports: Sequence[int], exclude_pids: set[int]) -> Sample:
    """One reading of /proc (see the module docstring)."""
    procs = _read_all_stats()
    group = process_tree(procs, triggerer_pgid) if triggerer_pgid is not None else []
    # OpenSSH 9.8+ (Debian 13) names the per-connection processes sshd-session.
    sshd = [p for p in procs if p.comm in ("sshd", "sshd-session") and p.pid not in exclude_pids]
    conns = established_to(parse_proc_net_tcp(_read("/proc/net/tcp")), login_ports)
    own_inodes = _socket_inodes(p.pid for p in group)
    mine = [c for c in conns if c.inode in own_inodes]
    return Sample(
        t=time.time(),
        login_conns=len(conns),
        triggerer_conns=len(mine),
        triggerer_ports=frozenset(c.local_port for c in mine),
        triggerer_cpu={p.pid: p.cpu_ticks for p in group},
        triggerer_rss_kib=sum(p.rss_pages for p in group) * PAGE_KIB,
        sshd_procs=len(sshd),
        sshd_rss_kib=sum(p.rss_pages for p in sshd) * PAGE_KIB,
        sbatch_procs=sum(1 for p in procs if p.comm == "sbatch"),
        mem_available_kib=mem_available_kib(_read("/proc/meminfo")),
        load1=float(_read("/proc/loadavg").split()[0]),
    )


def summarize(samples: Sequence[Sample], start: float, end: float) -> WindowStats | None:
    """Figures of the samples taken in [start, end]; None when there are fewer than two."""
    inside = [s for s in samples if start <= s.t <= end]
    if len(inside) < 2:
        return None
    seconds = inside[-1].t - inside[0].t
    ticks = cpu_ticks_between(inside[0].triggerer_cpu, inside[-1].triggerer_cpu)
    cpu = ticks / CLOCK_TICKS / seconds * 60 if seconds > 0 else None
    mem = [s.mem_available_kib for s in inside if s.mem_available_kib is not None]
    return WindowStats(
        seconds=seconds,
        samples=len(inside),
        login_conns_peak=max(s.login_conns for s in inside),
        login_conns_median=statistics.median(s.login_conns for s in inside),
        triggerer_conns_peak=max(s.triggerer_conns for s in inside),
        triggerer_conns_median=statistics.median(s.triggerer_conns for s in inside),
        triggerer_cpu_s_per_min=cpu,
        triggerer_rss_peak_mib=max(s.triggerer_rss_kib for s in inside) / 1024,
        sshd_procs_peak=max(s.sshd_procs for s in inside),
        sshd_rss_peak_mib=max(s.sshd_rss_kib for s in inside) / 1024,
        sbatch_procs_peak=max(s.sbatch_procs for s in inside),
        mem_available_min_mib=min(mem) / 1024 if mem else None,
        load1_median=statistics.median(s.load1 for s in inside),
    )


def triggerer_ports(samples: Iterable[Sample]) -> set[int]:
    """Every local port the triggerer was seen holding a login-host connection on."""
    ports: set[int] = set()
    for s in samples:
        ports |= s.triggerer_ports
    return ports


@dataclass
class Sampler:
    """Samples every `interval` seconds on a daemon thread until `stop()`; `samples` grows as it goes."""

    triggerer_pgid: int | None
    login_ports: tuple[int, ...]
    exclude_pids: set[int]
    interval: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.samples.append(take_sample(self.triggerer_pgid, self.login_ports, self.exclude_pids))
            except OSError:
                pass  # a process vanished mid-read more than once: skip this tick
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _read_all_stats() -> list[ProcStat]:
    stats = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stats.append(parse_proc_stat(_read(f"/proc/{name}/stat")))
        except (OSError, ValueError):
            continue  # exited between listdir and open
    return stats


def _socket_inodes(pids: Iterable[int]) -> set[int]:
    inodes: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                inode = socket_inode(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if inode is not None:
                inodes.add(inode)
    return inodes
