"""The triggerer benchmark's pure parts: /proc parsers, window figures, task-instance timing, squeue, the host
key pin, the tables, and the benchmark DAG's commands. No timing is asserted (figures live in benchmarks/)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import shlex
from pathlib import Path

import pytest

from benchmarks.deployment import pinned_host_key
from benchmarks.procfs import (
    cpu_ticks_between,
    established_to,
    mem_available_kib,
    parse_proc_net_tcp,
    parse_proc_stat,
    process_tree,
    socket_inode,
)
from benchmarks.sampler import Sample, summarize, triggerer_ports
from benchmarks.task_logs import deferral_span, fired_at, read_try_logs
from benchmarks.ti_watch import RunTimes, latency_stats
from benchmarks.triggerer import SideResult
from benchmarks.triggerer_phases import job_names, parse_squeue
from benchmarks.triggerer_report import cpu_ratios, rpc_types, side_by_side

REPO = Path(__file__).resolve().parents[2]

STAT = (
    "7342 (cat) R 7340 7340 20516 0 -1 4194304 100 0 0 0 12 5 0 0 20 0 1 0 3340490 3133440 414 "
    "18446744073709551615 94089821986816 94089822006697 140731414786192 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
)
NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   7: 0100007F:08AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2300733 1 0 100 0 0 10 0
  35: 0100007F:08AE 0100007F:C640 01 00000000:00000000 02:000A403D 00000000     0        0 2311424 2 0 20 4 31 22 -1
  36: 0100007F:C640 0100007F:08AE 01 00000000:00000000 02:000A403D 00000000     0        0 2311423 2 0 20 4 31 22 -1
  37: 0100007F:C641 0100007F:08AF 06 00000000:00000000 02:000A403D 00000000     0        0 0 2 0 20 4 31 22 -1
  38: 0100007F:C642 0100007F:6E21 01 00000000:00000000 02:000A403D 00000000     0        0 2311500 2 0 20 4 31 22 -1
"""


def test_parse_proc_stat_reads_cpu_rss_and_group():
    s = parse_proc_stat(STAT)
    assert (s.pid, s.comm, s.state, s.ppid, s.pgrp) == (7342, "cat", "R", 7340, 7340)
    assert (s.utime, s.stime, s.cpu_ticks, s.rss_pages) == (12, 5, 17, 414)


def test_parse_proc_stat_keeps_a_command_name_with_spaces_and_parens():
    s = parse_proc_stat(STAT.replace("(cat)", "(airflow (trig) x)"))
    assert (s.comm, s.pgrp, s.cpu_ticks) == ("airflow (trig) x", 7340, 17)


@pytest.mark.parametrize("bad", ["", "7342 cat R 1", "7342 (cat) R 1 2"])
def test_parse_proc_stat_refuses_what_is_not_a_stat_line(bad):
    with pytest.raises(ValueError):
        parse_proc_stat(bad)


def test_process_tree_takes_the_group_and_descendants_in_other_groups():
    def proc(pid: int, ppid: int, pgrp: int):
        return parse_proc_stat(STAT.replace("7342 (cat) R 7340 7340", f"{pid} (p) S {ppid} {pgrp}"))

    procs = [proc(10, 1, 10), proc(11, 10, 10), proc(12, 11, 12), proc(13, 12, 12), proc(14, 1, 10), proc(20, 1, 20)]
    assert sorted(p.pid for p in process_tree(procs, 10)) == [10, 11, 12, 13, 14]
    assert process_tree(procs, 99) == []


def test_established_client_sockets_to_the_login_ports():
    rows = parse_proc_net_tcp(NET_TCP)
    assert rows[1].local_addr == "127.0.0.1" and rows[1].local_port == 2222 and rows[1].remote_port == 50752
    client = established_to(rows, (2222, 2223))
    # the listener, the server side of the pair, the TIME_WAIT one and the other port are left out
    assert [(s.local_port, s.remote_port, s.inode) for s in client] == [(50752, 2222, 2311423)]


def test_socket_inode_and_meminfo():
    assert socket_inode("socket:[2311423]") == 2311423
    assert socket_inode("/dev/null") is None and socket_inode("pipe:[12]") is None
    assert mem_available_kib("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2048
    assert mem_available_kib("MemTotal: 100 kB\n") is None


def test_cpu_ticks_between_counts_new_and_reused_pids_from_zero():
    assert cpu_ticks_between({1: 100, 2: 50}, {1: 160, 2: 55}) == 65
    assert cpu_ticks_between({1: 100}, {1: 110, 3: 7}) == 17  # pid 3 started in between
    assert cpu_ticks_between({1: 100, 2: 9}, {1: 100}) == 0  # pid 2 exited: nothing more is known
    assert cpu_ticks_between({1: 100}, {1: 30}) == 30  # pid 1 reused by a new process


def _sample(t: float, ticks: int, conns: int = 1, ports: frozenset[int] = frozenset(), mem: int | None = 4096):
    return Sample(
        t=t, login_conns=conns + 1, triggerer_conns=conns, triggerer_ports=ports, triggerer_cpu={10: ticks},
        triggerer_rss_kib=2048 * (1 + int(t)), sshd_procs=2, sshd_rss_kib=1024, sbatch_procs=0,
        mem_available_kib=mem, load1=1.5,
    )  # fmt: skip


def test_summarize_cuts_the_window_and_rates_cpu_per_minute(monkeypatch):
    monkeypatch.setattr("benchmarks.sampler.CLOCK_TICKS", 100)
    samples = [_sample(0, 0), _sample(10, 100, conns=3), _sample(20, 400, mem=1024), _sample(30, 10_000)]
    w = summarize(samples, 10, 20)
    assert w is not None and w.samples == 2 and w.seconds == 10
    assert w.triggerer_cpu_s_per_min == pytest.approx(300 / 100 / 10 * 60)
    assert (w.triggerer_conns_peak, w.login_conns_peak, w.triggerer_rss_peak_mib) == (3, 4, 42)
    assert w.mem_available_min_mib == 1
    assert summarize(samples, 11, 19) is None


def test_triggerer_ports_unites_every_sample():
    samples = [_sample(0, 0, ports=frozenset({1, 2})), _sample(1, 0, ports=frozenset({2, 3}))]
    assert triggerer_ports(samples) == {1, 2, 3}


def test_run_times_follow_each_mapped_instance():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    times = RunTimes()
    times.observe([(0, "running", t0, None), (1, "queued", None, None)], now=100.0)
    times.observe([(0, "deferred", t0, None), (1, "deferred", t0 + dt.timedelta(seconds=2), None)], now=101.0)
    assert times.all_deferred_at(2) == 101.0 and times.all_deferred_at(3) is None
    later = t0 + dt.timedelta(seconds=50)  # the resumed try's start must not replace the submission's
    times.observe([(0, "scheduled", later, None), (1, "deferred", later, None)], now=150.0)
    times.observe([(0, "success", later, later.replace(tzinfo=None)), (1, "failed", later, later)], now=151.0)
    zero, one = times.tis[0], times.tis[1]
    assert (zero.start, zero.deferred_seen, zero.left_deferred_seen, zero.end) == (
        t0.timestamp(),
        101.0,
        150.0,
        later.timestamp(),
    )
    assert one.left_deferred_seen == 151.0 and one.start == t0.timestamp() + 2
    assert times.count("success") == 1 and times.count("success", "failed") == 2


def test_latency_stats_by_nearest_rank():
    assert latency_stats([]) is None
    assert latency_stats([3.0]) == (3.0, 3.0, 3.0)
    assert latency_stats([float(i) for i in range(1, 101)]) == (50.0, 95.0, 100.0)
    assert latency_stats([4.0, 1.0, 3.0, 2.0]) == (2.0, 4.0, 4.0)


def test_parse_squeue_and_job_names():
    text = "101|npa-x-1|PENDING\n102|bench-t-0|RUNNING\nnoise\n103|bench-t-0|PENDING\n"
    assert parse_squeue(text) == {"npa-x-1": ("101", "PENDING"), "bench-t-0": ("103", "PENDING")}
    assert job_names("anchor", "run", "t", 2) == ["bench-t-0", "bench-t-1"]
    npa = job_names("npa", "manual__1", "t", 2)
    assert len(set(npa)) == 2 and all(name.startswith("npa-npa-bench-waiting-npa-") for name in npa)


def test_pinned_host_key_picks_the_port_entry():
    known = "[127.0.0.1]:2223 ssh-ed25519 BBBB\n[127.0.0.1]:2222,[localhost]:2222 ssh-ed25519 AAAA x\n"
    assert pinned_host_key(known, "127.0.0.1", 2222) == "ssh-ed25519 AAAA"
    assert pinned_host_key("127.0.0.1 ssh-rsa CCCC\n", "127.0.0.1", 22) == "ssh-rsa CCCC"
    with pytest.raises(RuntimeError, match="dev/cluster up"):
        pinned_host_key(known, "127.0.0.1", 2224)


def test_tables_put_the_sides_next_to_each_other():
    npa = SideResult(side="npa", n=5, reached=5, defer_s=12.0, detection=(1.0, 2.0, 3.0), cancel_max_s=2.5)
    npa.slurmdbd_per_min = {"DBD_GET_JOBS_COND": 12.0}
    anchor = SideResult(side="anchor", n=5, reached=3, stopped="2 of 5 tasks failed before deferring")
    anchor.slurmctld_per_min = {"REQUEST_JOB_INFO_SINGLE": 60.0}
    text = side_by_side([npa, anchor], 5)
    header = next(line for line in text.splitlines() if line.startswith("| "))
    assert "npa N=5" in header and "SSH op N=5" in header
    assert "| 5 of 5 " in text and "| 3 of 5 " in text and "1.0 / 2.0 / 3.0" in text
    assert "SSH op N=5: 2 of 5 tasks failed before deferring" in text
    assert cpu_ratios([npa, anchor]) == []  # no steady window on the anchor side
    rpc = rpc_types([npa, anchor])
    assert "REQUEST_JOB_INFO_SINGLE" in rpc and "DBD_GET_JOBS_COND" in rpc


@pytest.fixture(scope="module")
def bench_dag():
    path = REPO / "benchmarks" / "dags" / "npa_bench_waiting.py"
    spec = importlib.util.spec_from_file_location("npa_bench_waiting_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_dag_has_the_two_mapped_sides(bench_dag):
    dag = bench_dag.dag
    assert {"npa", "anchor", "npa_commands", "anchor_commands"} <= set(dag.task_ids)
    assert type(dag.get_task("npa")).__name__ == "MappedOperator"
    assert type(dag.get_task("anchor")).__name__ == "MappedOperator"


def test_bench_dag_commands_stamp_the_job_end_and_hold_the_anchor_job(bench_dag):
    params = {"npa": 2, "anchor": 2, "tag": "npa-5-wait-1", "bench_dir": "/var/tmp/c/shared/bench"}
    npa = bench_dag.npa_commands.function(params)
    assert npa == [
        "sleep 1; date +%s.%N > /var/tmp/c/shared/bench/npa-5-wait-1/npa-0.end",
        "sleep 1; date +%s.%N > /var/tmp/c/shared/bench/npa-5-wait-1/npa-1.end",
    ]
    argv = shlex.split(bench_dag.anchor_commands.function(params)[1])
    assert argv[:3] == ["sbatch", "--wait", "--hold"] and "--job-name=bench-npa-5-wait-1-1" in argv
    assert argv[-1] == "--wrap=sleep 1; date +%s.%N > /var/tmp/c/shared/bench/npa-5-wait-1/anchor-1.end"


@pytest.mark.parametrize("tag, bench_dir", [("x; rm -rf /", "/b"), ("ok", "relative"), ("ok", "/a/../b")])
def test_bench_dag_refuses_unsafe_params(bench_dag, tag, bench_dir):
    with pytest.raises(ValueError, match="expected a short"):
        bench_dag.npa_commands.function({"npa": 1, "anchor": 0, "tag": tag, "bench_dir": bench_dir})


def test_cpu_ratio_pairs_the_sides_at_the_same_n():
    def side(name: str, n: int, cpu: float) -> SideResult:
        window = summarize([_sample(0, 0), _sample(60, int(cpu * 100))], 0, 60)
        return SideResult(side=name, n=n, window=window)

    results = [side("npa", 5, 1.0), side("anchor", 5, 12.0), side("npa", 9, 1.0)]
    assert [(n, round(x)) for n, x in cpu_ratios(results)] == [(5, 12)]


def _log(*events: tuple[str, str]) -> str:
    lines = [f'{{"timestamp":"2026-12-03T14:58:{t}Z","level":"info","event":"{e}"}}' for t, e in events]
    return "\n".join(["not json", *lines, '{"no": "timestamp"}'])


def test_task_and_trigger_log_times(tmp_path):
    task = _log(("03.500000", "::group::Pre Execute"), ("05.975000", "Pausing task as DEFERRED. "))
    trigger = _log(("07.410371", "trigger x (ID 1) starting"), ("40.338000", "Trigger fired event"))
    start, deferred = deferral_span(task)
    assert deferred - start == pytest.approx(2.475)
    assert fired_at(trigger) == pytest.approx(dt.datetime(2026, 12, 3, 14, 58, 40, 338000, dt.timezone.utc).timestamp())
    assert deferral_span(_log(("03.5", "::group::Pre Execute"))) is None and fired_at(task) is None
    (tmp_path / "attempt=1.log").write_text(task)
    (tmp_path / "attempt=1.log.trigger.7.log").write_text(trigger)
    assert read_try_logs(tmp_path) == (task, trigger)
    assert read_try_logs(tmp_path, 2) == ("", "")


def test_a_state_query_that_looks_for_end_records_still_counts_as_its_sacct():
    from benchmarks.counting import classify
    from npa_airflow.slurm.commands import build_sacct_states, build_squeue_states
    from npa_airflow.slurm.commands.end_records import with_end_records

    assert classify(with_end_records(build_sacct_states(["1", "2", "3"]), ["/r/a b/child_exit_code"])) == ("sacct", 3)
    assert classify(build_squeue_states(["7"])) == ("squeue", 1)
    assert classify("echo hi; exec true") == ("shell", 0)
