"""Log streaming: every poll fetches only the bytes that are new since the last one (byte offsets).

Two jobs are watched by one poller: a "big" job that writes about --log-mb MB of base64 in ten bursts, and a
"trickle" job that prints a short line every half second. The benchmark drives the real `SlurmPoller.cycle()`
back to back (0.5 s apart, faster than the poller's own 2 s floor, to keep the run short; bytes per poll do not
depend on the cadence) and checks, per cycle and file, that the chunk starts where the last one ended, and at
the end that the bytes received equal the file on shared storage (same SHA-256).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from dataclasses import dataclass, field

from benchmarks.cluster import ClusterEnv
from benchmarks.counting import CountingHook
from benchmarks.jobs import CONN_ID, BenchRun
from benchmarks.report import human_bytes, table
from npa_airflow.slurm.watch import poller as poller_module
from npa_airflow.slurm.watch.poller import SlurmPoller

CYCLE_PAUSE = 0.5
MAX_CYCLES = 400


@dataclass
class FileStats:
    path: str
    received: int = 0
    polls_with_data: int = 0
    max_per_poll: int = 0
    gaps_or_overlaps: int = 0
    sha: hashlib._Hash = field(default_factory=hashlib.sha256)  # type: ignore[name-defined]
    end: int = 0
    size_at_drained_flag: int | None = None
    offset_at_drained_flag: int | None = None


async def run(env: ClusterEnv, log_mb: int) -> dict:
    print("... log streaming", file=sys.stderr, flush=True)
    hook = CountingHook(CONN_ID)
    run_ = BenchRun(hook, env.shared, "logs")
    await run_.prepare()
    raw_per_burst = int(log_mb * 1_000_000 * 3 / 4 / 10 * 76 / 77)
    big_script = f"for i in $(seq 10); do head -c {raw_per_burst} /dev/urandom | base64 -w 76; sleep 0.5; done"
    trickle_script = 'for i in $(seq 24); do echo "step $i loss 0.$RANDOM"; sleep 0.5; done'
    try:
        big = await run_.submit_writer(big_script, "big")
        trickle = await run_.submit_writer(trickle_script, "trickle")
        poller = SlurmPoller(CONN_ID, lambda _: hook, autostart=False)
        hook.cycle = lambda: poller.stats.cycles
        regs = {
            "big": poller.register(big.job_id, log_offsets=[(big.stdout_path, 0)]),
            "trickle": poller.register(trickle.job_id, log_offsets=[(trickle.stdout_path, 0)]),
        }
        stats = {name: FileStats(job.stdout_path) for name, job in (("big", big), ("trickle", trickle))}
        done: set[str] = set()
        calls0 = len(hook.calls)
        started = time.monotonic()
        while len(done) < len(regs) and poller.stats.cycles < MAX_CYCLES:
            await poller.cycle()
            for name, reg in regs.items():
                while not reg.queue.empty():
                    update = reg.queue.get_nowait()
                    _account(stats[name], update)
                    fully_read = bool(update.chunks) and all(c.offset >= c.size for c in update.chunks)
                    if update.state.is_terminal and fully_read:
                        done.add(name)
                        poller.unregister(reg)
            await asyncio.sleep(CYCLE_PAUSE)
        seconds = time.monotonic() - started
        tails = [c for c in hook.calls[calls0:] if c.kind == "tail"]
        rows, raw = [], {}
        for name, st in stats.items():
            with open(st.path, "rb") as fh:
                local = fh.read()
            identical = hashlib.sha256(local).hexdigest() == st.sha.hexdigest()
            raw[name] = {
                "file_bytes": len(local),
                "received": st.received,
                "identical": identical,
                "gaps_or_overlaps": st.gaps_or_overlaps,
                "polls_with_data": st.polls_with_data,
                "max_per_poll": st.max_per_poll,
                "drained_flag_at": st.offset_at_drained_flag,
                "size_at_drained_flag": st.size_at_drained_flag,
            }
            rows.append(
                [
                    name,
                    human_bytes(len(local)),
                    human_bytes(st.received),
                    "yes" if identical else "NO",
                    st.gaps_or_overlaps,
                    st.polls_with_data,
                    human_bytes(st.max_per_poll),
                ]
            )
        wire = sum(c.stdout_bytes for c in tails)
        data = sum(st.received for st in stats.values())
        raw["tail_commands"] = len(tails)
        raw["cycles"] = poller.stats.cycles
        raw["wire_bytes"] = wire
        raw["seconds"] = seconds
        print(
            table(
                "Log streaming: bytes fetched vs bytes written",
                [
                    "job",
                    "file size",
                    "bytes received",
                    "identical (sha256)",
                    "gaps/overlaps",
                    "polls with data",
                    "max per poll",
                ],
                rows,
                f"{poller.stats.cycles} cycles, {len(tails)} tail commands (one per cycle for both files), "
                f"{human_bytes(wire)} of tail output (before SSH) for {human_bytes(data)} of log data "
                f"(framing + base64: {human_bytes(wire - data)}, {(wire - data) / max(1, len(tails)):.0f} B per "
                f"command); per-file cap per poll {human_bytes(poller_module.tail_budget(2))}.",
            )
        )
        big_stats = stats["big"]
        if big_stats.offset_at_drained_flag is not None:
            unread = (big_stats.size_at_drained_flag or 0) - big_stats.offset_at_drained_flag
            raw["big_unread_when_drained_flag"] = unread
            if unread > 0:
                print(
                    f"Poller reported the big job's logs drained with {human_bytes(unread)} still unread "
                    f"(MAX_STALLED_DRAIN_CYCLES={poller_module.MAX_STALLED_DRAIN_CYCLES}): a trigger would fire "
                    "and stop streaming there.\n"
                )
            else:
                print("Poller reported the big job's logs drained once every byte had been read.\n")
        return raw
    finally:
        await run_.cancel_all()
        await run_.remove_files()


def _account(st: FileStats, update) -> None:
    for chunk in update.chunks:
        start = chunk.offset - len(chunk.data)
        if chunk.data and start != st.end:
            st.gaps_or_overlaps += 1
        if chunk.data:
            st.received += len(chunk.data)
            st.polls_with_data += 1
            st.max_per_poll = max(st.max_per_poll, len(chunk.data))
            st.sha.update(chunk.data)
            st.end = chunk.offset
        if update.state.is_terminal and update.logs_drained and st.offset_at_drained_flag is None:
            st.offset_at_drained_flag, st.size_at_drained_flag = chunk.offset, chunk.size
