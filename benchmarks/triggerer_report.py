"""The triggerer benchmark's tables: one column per (N, side), this provider next to the anchor (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from benchmarks.report import table
from benchmarks.triggerer import SideResult

LABELS = {"npa": "npa", "npa_trigger": "npa, start_from_trigger", "anchor": "SSH op", "idle": "idle"}


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _lat(values: tuple[float, float, float] | None) -> str:
    return "-" if values is None else " / ".join(f"{v:.1f}" for v in values)


def _pair(a: float | None, b: float | None, digits: int = 0) -> str:
    return f"{_num(a, digits)} / {_num(b, digits)}"


def _cancel(r: SideResult) -> str:
    if r.cancel_max_s is not None:
        return f"{r.cancel_max_s:.1f}"
    return r.cancel_note or "-"


def _column_title(r: SideResult) -> str:
    return LABELS.get(r.side, r.side) if r.side == "idle" else f"{LABELS.get(r.side, r.side)} N={r.n}"


ROWS: list[tuple[str, Callable[[SideResult], str]]] = [
    ("tasks deferred at once", lambda r: "-" if r.side == "idle" else f"{r.reached} of {r.n}"),
    ("time to get all N deferred, s", lambda r: _num(r.defer_s, 0)),
    ("time to get all N submitted (in the queue), s", lambda r: _num(r.submitted_s, 0)),
    (
        "TCP conns to login hosts, peak: all / triggerer",
        lambda r: "-" if r.window is None else f"{r.window.login_conns_peak} / {r.window.triggerer_conns_peak}",
    ),
    (
        "TCP conns to login hosts, steady (median): all / triggerer",
        lambda r: "-" if r.window is None else _pair(r.window.login_conns_median, r.window.triggerer_conns_median),
    ),
    ("SSH conns opened per min: all / triggerer", lambda r: _pair(r.conns_per_min_all, r.triggerer_conns_per_min, 1)),
    ("sshd sessions per min: all / triggerer", lambda r: _pair(r.sessions_per_min_all, r.triggerer_sessions_min, 1)),
    ("slurmctld RPCs per min", lambda r: _num(sum(r.slurmctld_per_min.values()) if r.window else None)),
    ("slurmdbd RPCs per min", lambda r: _num(sum(r.slurmdbd_per_min.values()) if r.window else None)),
    ("triggerer CPU s per min", lambda r: _num(r.window.triggerer_cpu_s_per_min, 2) if r.window else "-"),
    ("triggerer peak RSS, MiB", lambda r: _num(r.whole.triggerer_rss_peak_mib, 0) if r.whole else "-"),
    (
        "login host: sshd procs peak / their RSS MiB",
        lambda r: "-" if r.whole is None else f"{r.whole.sshd_procs_peak} / {r.whole.sshd_rss_peak_mib:.0f}",
    ),
    ("login host: sbatch procs peak", lambda r: "-" if r.whole is None else str(r.whole.sbatch_procs_peak)),
    ("machine load (1-min average), median", lambda r: _num(r.whole.load1_median, 1) if r.whole else "-"),
    ("machine MemAvailable min, MiB", lambda r: _num(r.whole.mem_available_min_mib, 0) if r.whole else "-"),
    ("job end -> trigger fired, s p50 / p95 / max", lambda r: _lat(r.detection)),
    ("job end -> task success, s p50 / p95 / max", lambda r: _lat(r.success)),
    ("mark DAG run failed -> all N jobs gone, max s", _cancel),
    ("worker: try start -> DEFERRED, s p50 / p95 / max", lambda r: _lat(r.submit_wall)),
    ("worker: SSH conns / sshd sessions per submission", lambda r: _pair(r.submit_conns, r.submit_sessions, 2)),
    ("triggerer: sshd sessions per task, run start -> all N queued", lambda r: _num(r.start_sessions, 2)),
]


def _per_cycle(poll_interval: int) -> list[tuple[str, Callable[[SideResult], str]]]:
    """Steady-state rates per poll interval: the unit of the targets (commands and RPCs per cycle)."""
    cycles = 60 / poll_interval

    def rate(value: float | None) -> str:
        return _num(None if value is None else value / cycles, 2)

    return [
        ("triggerer sshd sessions per poll interval", lambda r: rate(r.triggerer_sessions_min)),
        (
            "slurmctld RPCs per poll interval",
            lambda r: rate(sum(r.slurmctld_per_min.values()) if r.window else None),
        ),
    ]


def side_by_side(results: Sequence[SideResult], poll_interval: int, note: str = "") -> str:
    headers = ["", *(_column_title(r) for r in results)]
    rows = [[label, *(fmt(r) for r in results)] for label, fmt in [*ROWS[:9], *_per_cycle(poll_interval), *ROWS[9:]]]
    stops = [f"{_column_title(r)}: {r.stopped}" for r in results if r.stopped]
    text = (
        f"Poll interval {poll_interval} s on both sides. 'triggerer' = the measured triggerer's process group "
        "(the second triggerer stopped). Steady figures over the window after all N deferred, jobs held. "
        "Job end = the job's own `date +%s.%N` stamp; trigger fired = the trigger log's 'Trigger fired event'. "
        "Worker = the task log's first line to 'Pausing task as DEFERRED'. "
        "Sessions = SSH channels sshd logged (one per remote command)."
    )
    for side in ("npa", "npa_trigger"):
        ratios = cpu_ratios(results, side)
        if ratios:
            figures = ", ".join(f"N={n}: {x:.1f}x" for n, x in ratios)
            text += f" Triggerer CPU per minute, anchor / {LABELS[side]}: {figures}."
    if stops:
        text += " Stopped short: " + "; ".join(stops) + "."
    if note:
        text += " " + note
    return table("Waiting in one real triggerer: this provider vs SSHRemoteJobOperator", headers, rows, text)


def cpu_ratios(results: Sequence[SideResult], side: str = "npa") -> list[tuple[int, float]]:
    """(N, anchor's triggerer CPU per minute / `side`'s) wherever both sides have a steady window."""
    cpu = {
        (r.side, r.n): r.window.triggerer_cpu_s_per_min
        for r in results
        if r.window is not None and r.window.triggerer_cpu_s_per_min
    }
    sizes = sorted(n for s, n in cpu if s == side and ("anchor", n) in cpu)
    return [(n, cpu[("anchor", n)] / cpu[(side, n)]) for n in sizes]


def rpc_types(results: Sequence[SideResult]) -> str:
    """slurmctld and slurmdbd RPCs per minute by message type in each steady window."""
    kinds = sorted({("slurmctld", k) for r in results for k in r.slurmctld_per_min})
    kinds += sorted({("slurmdbd", k) for r in results for k in r.slurmdbd_per_min})
    rows = []
    for daemon, kind in kinds:
        values = [(r.slurmctld_per_min if daemon == "slurmctld" else r.slurmdbd_per_min).get(kind) for r in results]
        rows.append([daemon, kind, *(_num(v) for v in values)])
    headers = ["daemon", "RPC type", *(_column_title(r) for r in results)]
    note = (
        "Per minute over each steady window (sdiag / sacctmgr show stats deltas, all clients; the benchmark's own "
        "two counter reads are subtracted). The 'idle' column is the same window with no task waiting."
    )
    return table("RPCs per minute by type (steady state)", headers, rows, note)
