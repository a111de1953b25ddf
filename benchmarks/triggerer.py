"""Triggerer benchmark: N mapped tasks of one DAG run waiting at once in ONE real `airflow triggerer` of the
production-shape deployment, this provider's `SlurmSubmitOperator` side by side with the SSH provider's
`SSHRemoteJobOperator` (the anchor), on the same cluster and sshd, N after N.

Per side and N, two DAG runs of `npa_bench_waiting` (benchmarks/dags):
1. wait: trigger, wait until all N are deferred (their jobs are held, so every N is really concurrent), hold a
   steady-state window, then release every job and wait for the N tasks to end;
2. cancel: trigger again, wait until all N are deferred, mark the DAG run failed, and time the jobs leaving
   the queue (up to --cancel-wait; what is still queued then is reported, then cancelled by the benchmark).
A side stops short of N when tasks fail before deferring, or when the machine's MemAvailable drops below
--mem-floor-mib (a result, recorded with where and why); it is then not run at larger N.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.deployment import DAG_ID
from benchmarks.sampler import WindowStats, summarize, triggerer_ports
from benchmarks.task_logs import deferral_span, fired_at, read_try_logs
from benchmarks.ti_watch import TERMINAL, RunTimes, latency_stats
from benchmarks.triggerer_phases import Bench, Marks, WindowCounts, job_names, log, read_stamps

SIDES = ("npa", "npa_trigger", "anchor")  # npa_trigger: started in the triggerer (start_from_trigger)


@dataclass
class Options:
    sizes: list[int]
    window: float = 120.0  # steady-state window, seconds
    cancel_wait: float = 60.0
    mem_floor_mib: int = 1500
    settle: float = 15.0  # pause between runs so one run's tail does not land in the next one's figures
    # Steady state starts this long after the last task deferred: the provider's poller polls at its 2 s floor
    # for 60 s after each submit (npa_airflow.slurm.watch.poll_records.FAST_WINDOW_SECONDS), then at the poll interval.
    steady_after: float = 65.0
    # The anchor's cancel run costs N more task starts and shows the same mechanism at every N (nothing cancels
    # its jobs: SSHRemoteJobTrigger has no on_kill); above this N it is skipped and the table says so.
    anchor_cancel_up_to: int | None = None
    sides: tuple[str, ...] = ("npa", "anchor")
    # A rerun after a change: ("steady", "cancel") takes the steady window in the cancel run, no wait run.
    phases: tuple[str, ...] = ("wait", "cancel")

    def defer_timeout(self, n: int) -> float:
        return 300.0 + 2.0 * n

    def finish_timeout(self, n: int) -> float:
        return 300.0 + 3.0 * n


@dataclass
class SideResult:
    side: str
    n: int
    reached: int = 0  # tasks deferred at the same time (n when the side got there)
    stopped: str | None = None
    defer_s: float | None = None
    submitted_s: float | None = None  # the run's start -> all N jobs in the queue
    window: WindowStats | None = None
    window_min: float | None = None
    triggerer_conns_per_min: float | None = None
    triggerer_sessions_min: float | None = None
    sessions_per_min_all: float | None = None
    conns_per_min_all: float | None = None
    slurmctld_per_min: dict[str, float] = field(default_factory=dict)
    slurmdbd_per_min: dict[str, float] = field(default_factory=dict)
    detection: tuple[float, float, float] | None = None  # job end -> trigger fired (left deferred)
    success: tuple[float, float, float] | None = None  # job end -> task success
    jobs_timed: int = 0
    finish_verdict: str | None = None
    cancel_max_s: float | None = None
    cancel_left: int | None = None
    cancel_states: dict[str, int] = field(default_factory=dict)
    cancel_note: str | None = None
    submit_wall: tuple[float, float, float] | None = None
    submit_conns: float | None = None
    submit_sessions: float | None = None
    start_sessions: float | None = None  # the triggerer's sshd sessions from the run's start to all N queued, per task
    whole: WindowStats | None = None  # every phase of the side: peak RSS, connections, memory


def run_side(bench: Bench, side: str, n: int, opts: Options, bench_dir: Path) -> SideResult:
    res = SideResult(side=side, n=n)
    started = time.time()
    try:
        if "wait" in opts.phases:
            _wait_run(bench, res, opts, bench_dir)
            time.sleep(opts.settle)
        if "cancel" not in opts.phases or res.stopped is not None:
            pass
        elif side == "anchor" and n > (opts.anchor_cancel_up_to or n):
            res.cancel_note = f"not measured (--anchor-cancel-up-to {opts.anchor_cancel_up_to})"
        else:
            _cancel_run(bench, res, opts, bench_dir)
    finally:
        res.whole = summarize(bench.sampler.samples, started, time.time())
    return res


def _tag(side: str, n: int, what: str) -> str:
    return f"{side}-{n}-{what}-{int(time.time()) % 100000}"


def _deferral(bench: Bench, res: SideResult, opts: Options, bench_dir: Path, tag: str) -> tuple[str, RunTimes, str]:
    """Start a DAG run of N tasks on this side and wait until all are deferred (or the side stops short)."""
    directory = bench_dir / tag
    directory.mkdir(parents=True)
    shutil.chown(directory, bench.cluster.user, bench.cluster.user)
    n, floor_kib = res.n, opts.mem_floor_mib * 1024
    conf = {**dict.fromkeys(SIDES, 0), res.side: n, "tag": tag, "bench_dir": str(bench_dir)}

    run: dict[str, str] = {}

    def until(times: RunTimes) -> str | None:
        if times.all_deferred_at(n) is not None:
            return "ok"
        if not times.tis and time.time() - marks.t > 60:  # nothing mapped yet: did the planning task fail?
            state = bench.deployment.api.dag_run(DAG_ID, run["id"])["state"]
            if state in ("failed", "success"):
                return f"the DAG run ended {state} before its {n} tasks were mapped"
        failed = times.count("failed", "upstream_failed")
        if failed:
            return f"{failed} of {n} tasks failed before deferring ({times.count('deferred')} deferred then)"
        latest = bench.sampler.latest()
        if latest and latest.mem_available_kib is not None and latest.mem_available_kib < floor_kib:
            mib = latest.mem_available_kib / 1024
            return f"MemAvailable fell to {mib:.0f} MiB with {times.count('deferred')} of {n} deferred"
        return None

    log(f"{res.side} N={n}: DAG run {tag}")
    marks = bench.mark()
    run_id = run["id"] = bench.trigger(conf)
    times, verdict = bench.watch(run_id, res.side, until, opts.defer_timeout(n))
    counts = bench.since(marks)
    res.reached = max(res.reached, times.count("deferred"))
    if verdict == "ok":
        res.defer_s = times.all_deferred_at(n) - marks.t  # type: ignore[operator]
        res.submitted_s = _all_queued(bench, job_names(res.side, run_id, tag, n), opts.defer_timeout(n)) - marks.t
        _submission_figures(bench, res, run_id, times, counts, marks.t)
        _start_sessions(bench, res, marks)
    return run_id, times, verdict


def _all_queued(bench: Bench, names: list[str], timeout: float) -> float:
    """When every job of `names` was in the queue (a task started in the triggerer defers before it submits): the
    latest of their submit times, slurmctld's own (a poll of the queue under load answers seconds late)."""
    deadline = time.time() + timeout
    while len(bench.job_ids(names)) < len(names) and time.time() < deadline:
        time.sleep(1.0)
    times = bench.submit_times(names)
    return max(times) if len(times) == len(names) else time.time()


def _submission_figures(
    bench: Bench, res: SideResult, run_id: str, times: RunTimes, counts: WindowCounts, t0: float
) -> None:
    """Worker side: the try's wall time (its log's first line -> "Pausing task as DEFERRED"), and the SSH
    connections and command sessions sshd saw from anything but the triggerer while the tasks deferred, per task."""
    walls = []
    for i in times.tis:
        task_log, _ = read_try_logs(bench.deployment.task_log_dir(run_id, res.side) / f"map_index={i}")
        span = deferral_span(task_log)
        if span is not None:
            walls.append(span[1] - span[0])
    res.submit_wall = latency_stats(walls)
    ports = triggerer_ports(s for s in bench.sampler.samples if s.t >= t0)
    conns, sessions = counts.sshd.count(ports=ports, mine=False)
    res.submit_conns, res.submit_sessions = conns / res.n, sessions / res.n


def _start_sessions(bench: Bench, res: SideResult, marks: Marks) -> None:
    """The command sessions sshd saw from the triggerer while the N jobs went into the queue, per task: the
    starts' reads and submissions in the triggerer (the polls of that span too, a few)."""
    counts = bench.since(marks)
    ports = triggerer_ports(s for s in bench.sampler.samples if s.t >= marks.t)
    res.start_sessions = counts.sshd.count(ports=ports)[1] / res.n


def _steady_window(bench: Bench, res: SideResult, opts: Options, deferred_at: float | None = None) -> None:
    if deferred_at is not None:
        time.sleep(max(0.0, deferred_at + opts.steady_after - time.time()))
    log(f"{res.side} N={res.n}: steady window of {opts.window:.0f} s")
    marks = bench.mark()
    time.sleep(opts.window)
    counts = bench.since(marks)
    minutes = counts.seconds / 60
    res.window_min = minutes
    res.window = summarize(bench.sampler.samples, marks.t, marks.t + counts.seconds)
    ports = triggerer_ports(s for s in bench.sampler.samples if marks.t <= s.t <= marks.t + counts.seconds)
    conns, sessions = counts.sshd.count(ports=ports)
    all_conns, all_sessions = counts.sshd.count()
    res.triggerer_conns_per_min = conns / minutes
    res.triggerer_sessions_min = sessions / minutes
    res.conns_per_min_all, res.sessions_per_min_all = all_conns / minutes, all_sessions / minutes
    res.slurmctld_per_min = {k: v / minutes for k, v in sorted(counts.slurmctld.items())}
    res.slurmdbd_per_min = {k: v / minutes for k, v in sorted(counts.slurmdbd.items())}


def _wait_run(bench: Bench, res: SideResult, opts: Options, bench_dir: Path) -> None:
    tag = _tag(res.side, res.n, "wait")
    run_id, times, verdict = _deferral(bench, res, opts, bench_dir, tag)
    names = job_names(res.side, run_id, tag, res.n)
    if verdict != "ok":
        res.stopped = verdict
        log(f"{res.side} N={res.n}: stopped short: {verdict}")
        _clean_up(bench, run_id, names)
        return
    _steady_window(bench, res, opts, deferred_at=times.all_deferred_at(res.n))
    ids = bench.job_ids(names)
    log(f"{res.side} N={res.n}: releasing {len(ids)} held jobs")
    bench.release(ids)

    def finished(times: RunTimes) -> str | None:
        return "ok" if times.count(*TERMINAL) >= res.n else None

    times, res.finish_verdict = bench.watch(run_id, res.side, finished, opts.finish_timeout(res.n))
    stamps = read_stamps(bench_dir / tag, res.side, res.n)
    fired = [t_fired - stamps[i] for i, t_fired in _fired_times(bench, run_id, res.side, times).items() if i in stamps]
    done = [times.tis[i].end - t for i, t in stamps.items() if _has(times, i, "end") and _ok(times, i)]
    res.detection, res.success, res.jobs_timed = latency_stats(fired), latency_stats(done), len(stamps)
    if res.finish_verdict != "ok":
        _clean_up(bench, run_id, names)


def _fired_times(bench: Bench, run_id: str, task_id: str, times: RunTimes) -> dict[int, float]:
    """{map index: when its trigger fired}: the trigger log's "Trigger fired event", else the first database
    poll that no longer saw the task deferred."""
    fired = {}
    for i, ti in times.tis.items():
        _, trigger_log = read_try_logs(bench.deployment.task_log_dir(run_id, task_id) / f"map_index={i}")
        at = fired_at(trigger_log)
        if at is None:
            at = ti.left_deferred_seen
        if at is not None:
            fired[i] = at
    return fired


def _has(times: RunTimes, i: int, attr: str) -> bool:
    return i in times.tis and getattr(times.tis[i], attr) is not None


def _ok(times: RunTimes, i: int) -> bool:
    return times.tis[i].state == "success"


def _cancel_run(bench: Bench, res: SideResult, opts: Options, bench_dir: Path) -> None:
    tag = _tag(res.side, res.n, "cancel")
    run_id, times, verdict = _deferral(bench, res, opts, bench_dir, tag)
    names = job_names(res.side, run_id, tag, res.n)
    if verdict != "ok":
        res.cancel_note = f"not measured: {verdict}"
        _clean_up(bench, run_id, names)
        return
    if "wait" not in opts.phases and "steady" in opts.phases:  # a rerun: the steady window before the cancel
        _steady_window(bench, res, opts, deferred_at=times.all_deferred_at(res.n))
    ids = bench.job_ids(names)
    log(f"{res.side} N={res.n}: marking the DAG run failed ({len(ids)} jobs queued)")
    marked = time.time()
    bench.mark_run_failed(run_id)
    gone, left = bench.watch_queue(ids, opts.cancel_wait)
    res.cancel_left = len(left)
    if gone and not left:
        res.cancel_max_s = max(gone.values()) - marked
    res.cancel_states = dict(bench.sacct_states(ids))
    if left:
        res.cancel_note = f"{len(left)} of {len(ids)} jobs still queued {opts.cancel_wait:.0f} s after the mark"
        bench.cancel(left)


def _clean_up(bench: Bench, run_id: str, names: list[str]) -> None:
    """Leave nothing behind: the DAG run failed, its jobs cancelled."""
    try:
        bench.mark_run_failed(run_id)
    except Exception as exc:
        log(f"could not mark {run_id} failed: {exc}")
    ids = bench.job_ids(names)
    if ids:
        bench.cancel(ids)


def remove_anchor_job_dirs(base: str = "/tmp/airflow-ssh-jobs") -> None:
    """The SSH operator's per-job directories of the benchmark's runs (it only cleans them on request)."""
    try:
        entries = os.listdir(base)
    except OSError:
        return
    for name in entries:
        if name.startswith("af_npa_bench_waiting_"):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def idle_window(bench: Bench, opts: Options) -> SideResult:
    """The same steady-state figures with no task waiting: the deployment's and cluster's own background."""
    res = SideResult(side="idle", n=0)
    _steady_window(bench, res, opts)
    res.whole = res.window
    return res


def warm_up(bench: Bench, opts: Options, bench_dir: Path) -> None:
    """One unmeasured task per side first: the fresh triggerer builds its in-process API on its first trigger,
    and the workers load the DAG file and the providers; no measured run should pay for that."""
    quick = Options(sizes=[1], window=0.0, cancel_wait=opts.cancel_wait, settle=2.0, steady_after=0.0)
    for side in opts.sides:
        _wait_run(bench, SideResult(side=side, n=1), quick, bench_dir)
    time.sleep(opts.settle)
