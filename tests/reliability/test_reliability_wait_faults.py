"""Faults while a task waits on a running job, on the real cluster: the login host's sshd down for 60 s,
slurmctld down for 60 s, accounting stalled (sacct answers RUNNING after the end), the triggerer restarted
mid-job (three times), 50 MB of output, binary garbage.
The trigger is driven directly (as the triggerer runs it) with the job's output collected as its task log.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from reliability_harness import (
    REPO,
    collecting_logger,
    context,
    make_operator,
    record_figures,
    run_trigger,
    submit_deferred,
    unique_dag,
)

from npa_airflow.slurm.watch.poller import reset_pollers

pytestmark = pytest.mark.integration
OUTAGE_SECONDS = 60


def ticks(lines: list[str], prefix: str = "tick-") -> list[int]:
    return [int(x[len(prefix) :]) for x in lines if x.startswith(prefix) and x[len(prefix) :].isdigit()]


async def wait_for_lines(collected, prefix: str, count: int, task: asyncio.Task, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while len(ticks(collected.lines, prefix)) < count:
        assert not task.done(), f"the trigger ended early: {collected.lines[-20:]}"
        assert time.monotonic() < deadline, f"no output after {timeout} s: {collected.lines[-20:]}"
        await asyncio.sleep(0.5)


async def hold_outage(task: asyncio.Task, seconds: float) -> None:
    """During the outage the waiting task keeps waiting: no event, no guessed outcome."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert not task.done(), f"the trigger reported during the outage: {task.result().payload}"
        await asyncio.sleep(1)


# -- sshd down for 60 s ---------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found + [g for c in found for g in _children(c)]


class PrivateSshd:
    """A login sshd of our own (the cluster's config on a free port): it may be stopped without touching the
    shared login hosts other tests use. Stopping kills the listener and its session processes, by PID. It runs
    where the bed's sshd run (its root filesystem, if any), so `directory` must be visible there."""

    def __init__(self, cluster, directory: Path) -> None:
        self.cluster = cluster
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        template = Path(cluster.dir, "etc", f"sshd_config-{cluster.port}").read_text().splitlines()
        lines = [line for line in template if not line.startswith(("Port ", "PidFile "))]
        self.config = directory / "sshd_config"
        self.config.write_text("\n".join([f"Port {self.port}", f"PidFile {directory}/sshd.pid", *lines]) + "\n")
        self.log = directory / "sshd.log"
        host_key = Path(cluster.dir, "ssh", f"host_{cluster.port}_ed25519.pub").read_text().split()[:2]
        self.known_hosts = directory / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {' '.join(host_key)}\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = self.cluster.admin_argv(["/usr/sbin/sshd", "-D", "-f", str(self.config), "-E", str(self.log)])
        env = {**os.environ, "NPA_CLUSTER_DIR": self.cluster.dir}
        self.proc = subprocess.Popen(argv, start_new_session=True, env=env)  # exec'd: the PID is sshd's
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in [self.proc.pid, *_children(self.proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


@pytest.fixture
def private_sshd(slurm_cluster, tmp_path, monkeypatch):
    directory = tmp_path
    if slurm_cluster.root:  # a directory its sshd sees: the bed's state directory is bound into its root
        directory = Path(slurm_cluster.dir, "run", f"private-sshd-{uuid.uuid4().hex[:8]}")
        directory.mkdir()
    sshd = PrivateSshd(slurm_cluster, directory)
    sshd.start()
    conn = json.loads(slurm_cluster.conn_uri_json)
    conn["port"] = sshd.port
    conn["extra"]["known_hosts"] = str(sshd.known_hosts)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_PRIVATE_SSHD", json.dumps(conn))
    try:
        yield sshd
    finally:
        sshd.stop()
        if directory != tmp_path:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
def test_sshd_down_60s_waiting_task_keeps_waiting_then_succeeds(private_sshd):
    op = make_operator(
        slurm_conn_id="slurm_private_sshd", command="for i in $(seq 1 75); do echo tick-$i; sleep 1; done"
    )
    trigger = submit_deferred(op, context(unique_dag("sshd")))

    async def scenario():
        logger, collected = collecting_logger("sshd")
        task = asyncio.ensure_future(run_trigger(trigger, logger, timeout=400))
        await wait_for_lines(collected, "tick-", 3, task)
        private_sshd.stop()
        stopped = time.monotonic()
        await hold_outage(task, OUTAGE_SECONDS)
        private_sshd.start()
        event = await task
        return event.payload, collected.lines, time.monotonic() - stopped

    reset_pollers()
    payload, lines, recovered_after = asyncio.run(scenario())
    assert payload["status"] == "success", payload
    assert ticks(lines) == list(range(1, 76))  # every line once, in order
    warnings = [x for x in lines if "state unknown" in x or "failed" in x]
    assert warnings, "the outage was not noticed"
    record_figures(
        "sshd_down_60s", injections=1, outage_seconds=OUTAGE_SECONDS, failed_polls_logged=len(warnings),
        result=payload["status"], seconds_to_event_after_stop=round(recovered_after, 1), lost_lines=0, lost=0,
    )  # fmt: skip


# -- slurmctld down for 60 s ------------------------------------------------------------------------------


def _slurmctld_pid(cluster) -> int:
    pid = int(Path(cluster.dir, "run", "pids", "slurmctld.pid").read_text().strip())
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    return pid


def _bring_cluster_back(cluster) -> None:
    env = {**os.environ, "NPA_CLUSTER_DIR": cluster.dir}
    subprocess.run([str(REPO / "dev" / "cluster"), "up"], env=env, check=True, capture_output=True, timeout=300)


@pytest.mark.slow
def test_slurmctld_down_60s_waiting_task_keeps_waiting_then_succeeds(slurm_cluster, cluster_admin):
    """slurmctld is frozen (SIGSTOP) for 60 s, so no client (nor a concurrent `dev/cluster up`) can
    reach or restart it; the job ends meanwhile. Nothing may be reported until the controller is back."""
    op = make_operator(command="for i in $(seq 1 40); do echo tick-$i; sleep 1; done")
    trigger = submit_deferred(op, context(unique_dag("ctld")))

    async def scenario():
        logger, collected = collecting_logger("ctld")
        task = asyncio.ensure_future(run_trigger(trigger, logger, timeout=400))
        await wait_for_lines(collected, "tick-", 3, task)
        pid = _slurmctld_pid(slurm_cluster)
        try:
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            refused = await asyncio.to_thread(cluster_admin, "timeout 20 squeue -h", check=False)
            await hold_outage(task, OUTAGE_SECONDS - (time.monotonic() - stopped))
        finally:
            os.kill(pid, signal.SIGCONT)
            if not Path(f"/proc/{pid}").exists():
                await asyncio.to_thread(_bring_cluster_back, slurm_cluster)
        event = await task
        return event.payload, collected.lines, time.monotonic() - stopped, refused

    reset_pollers()
    payload, lines, recovered_after, refused = asyncio.run(scenario())
    assert refused.returncode != 0, "slurmctld still answered while stopped"
    assert "UP" in cluster_admin("scontrol ping").stdout
    assert payload["status"] == "success", payload
    assert ticks(lines) == list(range(1, 41))
    record_figures(
        "slurmctld_down_60s", injections=1, outage_seconds=OUTAGE_SECONDS, result=payload["status"],
        seconds_to_event_after_stop=round(recovered_after, 1), lost_lines=0, lost=0,
    )  # fmt: skip


# -- accounting stalled --------------------------------------------------------------------------------


class StalledAccounting:
    """slurmdbd cannot record a job's end: another MariaDB session holds READ locks on the cluster's job and
    step tables, so slurmdbd's writes wait while its reads (sacct's) go on. sacct answers, from what it had:
    the lag a loaded slurmdbd shows (docs/benchmarks.md), made to last."""

    def __init__(self, cluster, cluster_name: str) -> None:
        self.socket = f"{cluster.dir}/run/mysqld.sock"
        self.tables = [f"{cluster_name}_job_table", f"{cluster_name}_step_table"]
        self.session: subprocess.Popen[str] | None = None

    def __enter__(self) -> StalledAccounting:
        argv = ["mariadb", "--no-defaults", f"--socket={self.socket}", "-uroot", "-N", "--unbuffered", "slurm_acct_db"]
        self.session = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        locks = ", ".join(f"`{t}` READ" for t in self.tables)
        assert self.session.stdin and self.session.stdout
        self.session.stdin.write(f"LOCK TABLES {locks}; SELECT 'locked';\n")
        self.session.stdin.flush()
        assert self.session.stdout.readline().strip() == "locked"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.session and self.session.stdin
        self.session.stdin.write("UNLOCK TABLES;\n")
        self.session.stdin.close()
        self.session.wait(30)


def _sacct_state(cluster_admin, job_id: str) -> str:
    out = cluster_admin(f"sacct -X -n -P -j {job_id} -o State", check=False).stdout.split()
    return out[0] if out else ""


@pytest.mark.accounting("stalls slurmdbd, which the bed without accounting does not run")
def test_accounting_stalled_the_job_end_is_seen_from_squeue_within_a_poll(slurm_cluster, cluster_admin):
    """The job ends while slurmdbd cannot record it: sacct keeps saying RUNNING (or PENDING, if the start was not
    recorded yet either). The job's end record (its script's last write) makes the poller ask squeue, which knows
    it COMPLETED: the task succeeds with every line, while accounting still has no end."""
    cluster_name = cluster_admin("scontrol show config | sed -n 's/^ClusterName *= *//p'").stdout.strip()
    op = make_operator(command="for i in $(seq 1 8); do echo tick-$i; sleep 1; done; date +end=%s.%N")
    trigger = submit_deferred(op, context(unique_dag("acct")))
    job_id = trigger.job_id

    async def scenario():
        logger, collected = collecting_logger("acct")
        task = asyncio.ensure_future(run_trigger(trigger, logger, timeout=300))
        await wait_for_lines(collected, "tick-", 2, task)
        with StalledAccounting(slurm_cluster, cluster_name):
            try:
                event = await asyncio.wait_for(task, 90)
            except asyncio.TimeoutError:
                pytest.fail(f"no event 90 s into the stall; the trigger's log: {collected.lines}")
            fired = time.time()
            sacct_then = await asyncio.to_thread(_sacct_state, cluster_admin, job_id)
            squeue_then = cluster_admin(f"squeue -h -t all -j {job_id} -o %T", check=False).stdout.strip()
        return event.payload, collected.lines, sacct_then, squeue_then, fired

    reset_pollers()
    payload, lines, sacct_then, squeue_then, fired = asyncio.run(scenario())
    assert payload["status"] == "success", payload
    # RUNNING, or PENDING when slurmdbd had not recorded the start either (as after the slurmctld-outage test)
    assert sacct_then in ("RUNNING", "PENDING"), f"accounting was not stalled (sacct said {sacct_then!r})"
    assert squeue_then == "COMPLETED"
    assert ticks(lines) == list(range(1, 9)), lines
    ended = float(next(x for x in lines if x.startswith("end="))[4:])
    for _ in range(60):  # once released, accounting catches up
        if _sacct_state(cluster_admin, job_id) == "COMPLETED":
            break
        time.sleep(1)
    assert _sacct_state(cluster_admin, job_id) == "COMPLETED"
    record_figures(
        "accounting_stalled", injections=1, result=payload["status"], sacct_at_event=sacct_then,
        seconds_from_job_end_to_event=round(fired - ended, 1), poll_interval_s=2,
    )  # fmt: skip


# -- triggerer restarts -----------------------------------------------------------------------------------


def test_triggerer_restarted_three_times_mid_job_log_neither_lost_nor_replayed(slurm_cluster):
    op = make_operator(command="for i in $(seq 1 60); do echo tick-$i; sleep 0.3; done")
    trigger = submit_deferred(op, context(unique_dag("restart")))
    kwargs = trigger.serialize()[1]
    restarts = 3

    async def one_run(stop_after: int | None, seen: list[str]):
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        t = SlurmJobTrigger(**kwargs)  # rebuilt from the stored kwargs, as a new triggerer does
        logger, collected = collecting_logger("restart")
        task = asyncio.ensure_future(run_trigger(t, logger, timeout=180))
        if stop_after is None:
            event = await task
            seen.extend(collected.lines)
            return event.payload
        await wait_for_lines(collected, "tick-", stop_after, task)
        task.cancel()  # triggerer shutdown: no event, no on_kill; cleanup keeps the log position
        with pytest.raises(asyncio.CancelledError):
            await task
        await t.cleanup()
        seen.extend(collected.lines)
        return None

    seen: list[str] = []
    for _ in range(restarts):
        reset_pollers()
        asyncio.run(one_run(3, seen))
    reset_pollers()
    payload = asyncio.run(one_run(None, seen))
    assert payload["status"] == "success"
    numbers = ticks(seen)
    assert numbers == list(range(1, 61)), numbers  # nothing lost, nothing replayed
    record_figures("triggerer_restart", injections=restarts, lines=60, lost_lines=0, replayed_lines=0)


# -- output that is huge, or not text ---------------------------------------------------------------------


def test_binary_and_invalid_utf8_output_does_not_break_streaming(slurm_cluster):
    command = (
        "echo before-garbage; head -c 300000 /dev/urandom; printf '\\n\\xff\\xfe\\xc3\\x28 \\x80\\n'; "
        "printf 'partial-line-without-newline'; printf '\\n'; head -c 100000 /dev/urandom >&2; echo after-garbage"
    )
    trigger = submit_deferred(make_operator(command=command), context(unique_dag("binary")))
    reset_pollers()
    logger, collected = collecting_logger("binary")
    event = asyncio.run(run_trigger(trigger, logger, timeout=120))
    assert event.payload["status"] == "success", event.payload
    assert "before-garbage" in collected.lines and "after-garbage" in collected.lines
    assert collected.lines.index("before-garbage") < collected.lines.index("after-garbage")
    assert "partial-line-without-newline" in collected.lines
    record_figures("binary_output", injections=1, bytes_of_garbage=400_000, result="success", lost=0)


@pytest.mark.slow
def test_50_mb_of_output_streams_completely(slurm_cluster):
    lines = 51_200  # 1,009 bytes each: 51.7 MB
    command = f"for i in $(seq 1 {lines}); do printf 'line-%07d %01000d\\n' \"$i\" 0; done; echo end-of-output"
    trigger = submit_deferred(make_operator(command=command), context(unique_dag("big")))
    reset_pollers()
    logger, collected = collecting_logger("big")
    started = time.monotonic()
    event = asyncio.run(run_trigger(trigger, logger, timeout=600))
    elapsed = time.monotonic() - started
    numbers = [int(x[5:12]) for x in collected.lines if x.startswith("line-")]
    record_figures(
        "output_50mb", bytes=lines * 1009, lines_streamed=len(numbers), lines_written=lines,
        seconds=round(elapsed, 1), result=event.payload["status"],
    )  # fmt: skip
    assert event.payload["status"] == "success", event.payload
    assert numbers == list(range(1, lines + 1)), f"streamed {len(numbers)} of {lines} lines"
    assert "end-of-output" in collected.lines
