"""The shared poller on the real cluster: many waiting jobs cost one connection and a fixed set of
commands per cycle (counted, never timed)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.submit.staging import StagedFile
from npa_airflow.slurm.transport import ssh
from npa_airflow.slurm.watch.poller import SlurmPoller, offsets_file_for

pytestmark = pytest.mark.integration

JOBS = 6


class CountingHook(SlurmHook):
    """The real hook, counting the remote commands it runs."""

    commands: list[str]

    async def arun(self, argv, **kwargs):
        self.commands.append(argv if isinstance(argv, str) else " ".join(argv))
        return await super().arun(argv, **kwargs)


async def submit_jobs(hook: SlurmHook, workdir: str) -> list[tuple[str, str]]:
    jobs = []
    for i in range(JOBS):
        script = f"{workdir}/job{i}.sbatch"
        out = f"{workdir}/job{i}.out"
        body = f"#!/bin/bash\nfor n in 1 2 3; do echo job{i}-line$n; sleep 1; done\n"
        result = await hook.astage_and_submit(
            [StagedFile(script, body.encode(), 0o700)],
            script,
            sbatch_args=["--partition=cpu", f"--output={out}", "--time=2", "--cpus-per-task=1"],
        )
        jobs.append((result.job_id, out))
    return jobs


def test_many_jobs_one_connection_and_one_state_query_per_cycle(slurm_cluster):
    async def scenario() -> tuple[SlurmPoller, CountingHook, list, int]:
        hook = CountingHook("slurm_default")
        hook.commands = []
        workdir = f"{slurm_cluster.shared}/tests/poller-{uuid.uuid4().hex[:8]}"
        jobs = await submit_jobs(hook, workdir)
        connects_before = ssh.loop_pool().connects
        hook.commands.clear()
        poller = SlurmPoller("slurm_default", lambda _: hook, autostart=False)
        regs = [
            poller.register(job_id, log_offsets=[(out, 0)], offsets_file=offsets_file_for(out)) for job_id, out in jobs
        ]
        lines: dict[str, bytes] = {job_id: b"" for job_id, _ in jobs}
        finished: set[str] = set()
        for _ in range(120):
            await poller.cycle()
            for reg in regs:
                while not reg.queue.empty():
                    update = reg.queue.get_nowait()
                    for chunk in update.chunks:
                        lines[reg.job_id] += chunk.data
                        reg.commit(chunk.path, chunk.offset)
                    if update.state.is_terminal and update.logs_drained:
                        finished.add(reg.job_id)
            if len(finished) == JOBS:
                break
            await asyncio.sleep(1)
        connects = ssh.loop_pool().connects - connects_before
        return poller, hook, [(jobs[i][0], lines[jobs[i][0]]) for i in range(JOBS)], connects

    poller, hook, outputs, connects = asyncio.run(scenario())
    stats = poller.stats
    assert stats.max_jobs_per_query == JOBS
    assert stats.state_queries == stats.cycles and stats.log_queries <= stats.cycles
    assert connects == 0  # everything rode the connection the submissions opened
    if not slurm_cluster.accounting:
        # ONE squeue per cycle for all jobs, with their end records; the first cycle's sacct (and the squeue in its
        # round trip) taught the hook that there is no accounting, and no sacct ran after it
        squeues = [c for c in hook.commands if "squeue -h -t all" in c and "--jobs=" in c and "sacct" not in c]
        sacct = [i for i, c in enumerate(hook.commands) if "sacct -X" in c]
        assert len(squeues) == stats.cycles and len(sacct) <= 1 and all(i < 2 for i in sacct), hook.commands
    else:
        state_queries = [c for c in hook.commands if "sacct -X" in c]
        alone = [c for c in hook.commands if c.startswith("squeue")]
        assert len(state_queries) == stats.cycles  # ONE sacct per cycle for all jobs
        # The jobs seen pending (or not yet seen) have their one squeue in the same command as the sacct; the
        # others cost slurmctld nothing (no squeue) while accounting knows them.
        assert all(c.count("squeue ") <= 1 for c in state_queries)
        assert "squeue " in state_queries[0]  # none seen yet
        assert len(alone) <= stats.cycles  # at most one squeue after the sacct per cycle
        assert len(hook.commands) <= stats.cycles * 3 + 1  # + one batched offsets load
    for i, (_job_id, data) in enumerate(outputs):
        assert data == "".join(f"job{i}-line{n}\n" for n in (1, 2, 3)).encode()
