"""N SlurmJobTriggers in one process make ONE state query per poll cycle, on the real cluster over real SSH.

What reached the login host is counted twice, independently: sshd (LogLevel VERBOSE) logs every command session
with the client's source port, and the pooled connection's port is known; a recording SlurmHook subclass says
what each command carried. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import uuid
from collections import Counter

import pytest

from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.transport import ssh
from npa_airflow.slurm.triggers import SlurmJobTrigger
from npa_airflow.slurm.watch.poller import get_poller, reset_pollers

pytestmark = [pytest.mark.integration, pytest.mark.accounting("counts the one sacct of each poller cycle")]

N_JOBS = 20
CYCLES_BEFORE_CANCEL = 3
_SESSION = re.compile(r"^Starting session: \S+ for \S+ from \S+ port (\d+) id \d+")
_CONNECTION = re.compile(r"^Connection from \S+ port (\d+) on ")


class RecordingHook(SlurmHook):
    """SlurmHook that records (poll cycle, argv) of every command before it is sent; a batch of commands sent in
    one round trip (arun_batch) is recorded once, as the list of its commands' argv."""

    def __init__(self, conn_id: str) -> None:
        super().__init__(conn_id)
        self.sent: list[tuple[int, list]] = []
        self.cycle = lambda: 0
        self._batch: list | None = None

    async def arun_batch(self, argvs, timeout=120):  # type: ignore[override]
        self._batch = [a if isinstance(a, str) else list(a) for a in argvs]
        return await super().arun_batch(argvs, timeout)

    async def arun(self, argv, **kwargs):  # type: ignore[override]
        batch, self._batch = self._batch, None
        self.sent.append((self.cycle(), batch if batch is not None else argv if isinstance(argv, str) else list(argv)))
        return await super().arun(argv, **kwargs)


def _argv_of(command: list[str] | str) -> list[str]:
    """The state query's argv: a shell line that first looks for end records ends in ``exec <argv>``."""
    if isinstance(command, list):
        return command
    _, found, query = command.rpartition("; exec ")
    return shlex.split(query) if found else []


def _commands(sent: list[tuple[int, list]]) -> list[tuple[int, list[str]]]:
    """(cycle, argv) of every Slurm command (sacct or squeue) sent, batched ones included."""
    out = []
    for cycle, argv in sent:
        parts = argv if isinstance(argv, list) and argv and isinstance(argv[0], (list, str)) else [argv]
        out += [(cycle, a) for a in map(_argv_of, parts) if a and a[0] in ("sacct", "squeue")]
    return out


def _sshd_counts(log_path: str, mark: int, port: int) -> tuple[int, int]:
    """(connections, command sessions) sshd logged for client port ``port`` since byte ``mark``."""
    with open(log_path, "rb") as fh:
        fh.seek(mark)
        lines = fh.read().decode("utf-8", errors="replace").splitlines()
    sessions = sum(1 for line in lines if (m := _SESSION.match(line)) and int(m.group(1)) == port)
    connections = sum(1 for line in lines if (m := _CONNECTION.match(line)) and int(m.group(1)) == port)
    return connections, sessions


def _id_list_of(argv: list[str]) -> list[str]:
    for i, arg in enumerate(argv):
        if arg == "-j":
            return argv[i + 1].split(",")
        if arg.startswith("--jobs="):
            return arg.split("=", 1)[1].split(",")
    raise AssertionError(f"no job id list in {argv}")


def _ids_of(argv: list[str]) -> set[str]:
    return set(_id_list_of(argv))


async def _cycle_when_all_registered(poller, count: int) -> int:
    """Wait until `poller` holds `count` registrations; return its cycle number at that moment."""
    for _ in range(600):  # liveness bound only
        if len(poller.registrations) >= count:
            return poller.stats.cycles
        await asyncio.sleep(0.05)
    raise AssertionError(f"only {len(poller.registrations)} of {count} triggers registered")


async def _submit_held(hook: SlurmHook, tag: str, count: int) -> list[str]:
    line = f"sbatch --parsable --hold -p cpu -J {tag} -o /dev/null --wrap 'sleep 60'"
    result = await hook.arun(["bash", "-c", f"set -e; for i in $(seq {count}); do {line}; done"], timeout=300)
    return [row.split(";")[0] for row in result.text.split()]


def _handle(job_id: str, tag: str, results: str) -> dict:
    return SlurmJobHandle(
        conn_id="slurm_default",
        cluster=None,
        job_id=job_id,
        job_name=tag,
        login_host="127.0.0.1",
        results_dir=results,
        stdout_path=f"{results}/{job_id}.out",
        stderr_path=f"{results}/{job_id}.out",
        try_number=1,
    ).to_dict()


async def test_n_triggers_make_one_state_query_per_cycle_on_the_cluster(slurm_cluster):
    reset_pollers()
    tag = f"npa-coalesce-{uuid.uuid4().hex[:8]}"
    hook = RecordingHook("slurm_default")
    job_ids = await _submit_held(hook, tag, N_JOBS)
    assert len(job_ids) == N_JOBS
    try:
        poller = get_poller("slurm_default", lambda _: hook)
        hook.cycle = lambda: poller.stats.cycles
        conn = ssh.loop_pool().connections[(await hook.aconfig()).pool_key][0]
        port = int(conn.get_extra_info("sockname")[1])
        sshd_log = f"{slurm_cluster.dir}/log/sshd-{slurm_cluster.port}.log"
        mark, sent0, connects0 = os.path.getsize(sshd_log), len(hook.sent), ssh.loop_pool().connects

        events: dict[str, dict] = {}

        async def wait(trigger: SlurmJobTrigger) -> None:
            async for event in trigger.run():
                events[trigger.job_id] = event.payload

        results = f"{slurm_cluster.results_root}/{tag}"
        triggers = [SlurmJobTrigger(_handle(j, tag, results), "slurm_default", poll_interval=2) for j in job_ids]
        tasks = [asyncio.create_task(wait(t)) for t in triggers]
        try:
            # Triggers register as their tasks get to run: a cycle may start before the last one has. Every
            # cycle that starts after the last registration (and before the cancel) must carry all N jobs.
            all_registered_after = await _cycle_when_all_registered(poller, N_JOBS)
            for _ in range(600):  # liveness bound only (60 s), not a timing assertion
                if poller.stats.cycles >= all_registered_after + CYCLES_BEFORE_CANCEL:
                    break
                await asyncio.sleep(0.1)
            assert poller.stats.cycles >= all_registered_after + CYCLES_BEFORE_CANCEL, "the poller did not cycle"
            assert not events, f"held jobs fired early: {events}"
            last_full_cycle = poller.stats.cycles
            await hook.arun(["scancel", "-n", tag])  # ends every job outside the triggers
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        cycles = poller.stats.cycles

        # every trigger got its event from the shared cycles
        assert sorted(events) == sorted(job_ids)
        assert {e["status"] for e in events.values()} == {"canceled"}

        sent = hook.sent[sent0:]
        state = _commands(sent)
        sacct_per_cycle = Counter(cycle for cycle, argv in state if argv[0] == "sacct")
        squeue_per_cycle = Counter(cycle for cycle, argv in state if argv[0] == "squeue")
        # exactly one sacct per cycle for all jobs, at most two squeues (one with the sacct for the pending jobs'
        # reasons, one after it for what sacct cannot settle), and nothing else per job
        assert sacct_per_cycle == Counter(range(1, cycles + 1)), (sacct_per_cycle, cycles)
        assert all(n <= 2 for n in squeue_per_cycle.values()), squeue_per_cycle
        for cycle, argv in state:
            ids = _ids_of(argv)
            assert len(_id_list_of(argv)) == len(ids), f"a job queried twice in one command: {argv}"
            assert ids <= set(job_ids), argv
            if all_registered_after < cycle <= last_full_cycle:  # every job held: sacct and squeue carry all
                assert ids == set(job_ids), f"cycle {cycle} did not carry every watched job: {argv}"
        assert set().union(*(_ids_of(a) for _, a in state if a[0] == "sacct")) == set(job_ids)
        # round trips per cycle are bounded independently of N: state (1-2) + offsets load + scancel
        assert len(sent) <= 2 * cycles + 2, [argv if isinstance(argv, list) else "<shell>" for _, argv in sent]

        # the server saw exactly these commands, all on the one pooled connection, and no new connection
        connections, sessions = _sshd_counts(sshd_log, mark, port)
        assert connections == 0
        assert ssh.loop_pool().connects == connects0
        assert sessions == len(sent), (sessions, len(sent))
    finally:
        await hook.arun(["scancel", "-n", tag], check=False)
        reset_pollers()


async def test_two_clusters_get_one_poller_and_one_connection_each(slurm_cluster, monkeypatch):
    """Triggers of two connections (here: the two login sshd of the local cluster) poll independently."""
    conn = json.loads(slurm_cluster.conn_uri_json)
    conn["port"] = slurm_cluster.port2
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_SECOND", json.dumps(conn))
    reset_pollers()
    tag = f"npa-coalesce2-{uuid.uuid4().hex[:8]}"
    hooks = {cid: RecordingHook(cid) for cid in ("slurm_default", "slurm_second")}
    job_ids = await _submit_held(hooks["slurm_default"], tag, 6)
    try:
        watched = {"slurm_default": job_ids[:3], "slurm_second": job_ids[3:]}
        pollers = {cid: get_poller(cid, lambda _, h=hooks[cid]: h) for cid in hooks}
        for cid, hook in hooks.items():
            hook.cycle = lambda p=pollers[cid]: p.stats.cycles
        events: dict[str, dict] = {}

        async def wait(trigger: SlurmJobTrigger) -> None:
            async for event in trigger.run():
                events[trigger.job_id] = event.payload

        results = f"{slurm_cluster.results_root}/{tag}"
        tasks = []
        for cid, ids in watched.items():
            for j in ids:
                handle = {**_handle(j, tag, results), "conn_id": cid}
                tasks.append(asyncio.create_task(wait(SlurmJobTrigger(handle, cid, poll_interval=2))))
        try:
            full_after = {cid: await _cycle_when_all_registered(p, len(watched[cid])) for cid, p in pollers.items()}
            for _ in range(600):
                if all(p.stats.cycles >= full_after[cid] + 2 for cid, p in pollers.items()):
                    break
                await asyncio.sleep(0.1)
            last_full = {cid: p.stats.cycles for cid, p in pollers.items()}
            await hooks["slurm_default"].arun(["scancel", "-n", tag])
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        assert sorted(events) == sorted(job_ids)
        assert {e["status"] for e in events.values()} == {"canceled"}
        for cid, hook in hooks.items():
            sacct = [(c, a) for c, a in _commands(hook.sent) if a[0] == "sacct"]
            assert Counter(c for c, _ in sacct) == Counter(range(1, pollers[cid].stats.cycles + 1))
            assert all(_ids_of(a) <= set(watched[cid]) for _, a in sacct), (cid, sacct)
            full = [a for c, a in sacct if full_after[cid] < c <= last_full[cid]]
            assert full and all(_ids_of(a) == set(watched[cid]) for a in full), (cid, sacct)
        ports = {key: entry[0].get_extra_info("peername")[1] for key, entry in ssh.loop_pool().connections.items()}
        assert sorted(ports.values()) == sorted([slurm_cluster.port, slurm_cluster.port2])
    finally:
        await hooks["slurm_default"].arun(["scancel", "-n", tag], check=False)
        reset_pollers()
