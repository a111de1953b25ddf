"""Cheap benchmark jobs on the local cluster, submitted in bulk over the pooled connection.

Every job of one run carries the run's job name, so cleanup cancels exactly the benchmark's jobs.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.hook import SlurmHook

CONN_ID = "slurm_default"


@dataclass(frozen=True)
class BenchJob:
    job_id: str
    stdout_path: str
    finishes: bool  # False: held filler that stays PENDING until cancelled

    def handle(self, job_name: str, results_dir: str) -> dict:
        return SlurmJobHandle(
            conn_id=CONN_ID,
            cluster=None,
            job_id=self.job_id,
            job_name=job_name,
            login_host="127.0.0.1",
            results_dir=results_dir,
            stdout_path=self.stdout_path,
            stderr_path=self.stdout_path,
            try_number=1,
            submitted_at=None,  # steady-state cadence: no fast window after submit
        ).to_dict()


class BenchRun:
    """One benchmark run's jobs: a unique job name and results directory on shared storage."""

    def __init__(self, hook: SlurmHook, shared: str, label: str) -> None:
        self.hook = hook
        self.tag = f"npabench-{label}-{uuid.uuid4().hex[:8]}"
        self.results_dir = f"{shared}/results/npabench/{self.tag}"

    async def prepare(self) -> None:
        await self.hook.arun(["mkdir", "-p", self.results_dir])

    async def _sbatch_many(self, lines: Sequence[str]) -> list[str]:
        """Run many ``sbatch --parsable`` lines in ONE remote command; return the job ids in order."""
        script = "set -e\n" + "\n".join(lines)
        result = await self.hook.arun(["bash", "-c", script], timeout=600)
        ids = [line.split(";")[0].strip() for line in result.text.splitlines() if line.strip()]
        if len(ids) != len(lines):
            raise RuntimeError(f"expected {len(lines)} job ids, sbatch printed {result.text[-500:]!r}")
        return ids

    async def submit_fillers(self, count: int) -> list[BenchJob]:
        """Held jobs: PENDING until cancelled, holding no CPU (they still cost every poll)."""
        if count <= 0:
            return []
        line = shlex.join(
            ["sbatch", "--parsable", "--hold", "-p", "cpu", "-J", self.tag, "-o", "/dev/null", "--wrap", "sleep 600"]
        )
        script = f"for i in $(seq {int(count)}); do {line}; done"
        result = await self.hook.arun(["bash", "-c", "set -e\n" + script], timeout=900)
        ids = [row.split(";")[0].strip() for row in result.text.splitlines() if row.strip()]
        if len(ids) != count:
            raise RuntimeError(f"expected {count} job ids, sbatch printed {result.text[-500:]!r}")
        return [BenchJob(job_id=i, stdout_path=f"{self.results_dir}/filler-{i}.out", finishes=False) for i in ids]

    async def submit_finishers(self, sleeps: Sequence[float]) -> list[BenchJob]:
        """Jobs that sleep, then print the epoch time as their last line: the moment the job's work ended."""
        paths = [f"{self.results_dir}/finisher-{n}.out" for n in range(len(sleeps))]
        lines = [
            shlex.join(
                [
                    "sbatch",
                    "--parsable",
                    "--no-requeue",
                    "-p",
                    "cpu",
                    "-J",
                    self.tag,
                    "-o",
                    path,
                    "--wrap",
                    f"sleep {s}; date +%s.%N",
                ]
            )
            for s, path in zip(sleeps, paths, strict=True)
        ]
        ids = await self._sbatch_many(lines)
        return [BenchJob(job_id=i, stdout_path=p, finishes=True) for i, p in zip(ids, paths, strict=True)]

    async def submit_writer(self, script: str, name: str) -> BenchJob:
        path = f"{self.results_dir}/{name}.out"
        line = shlex.join(["sbatch", "--parsable", "-p", "cpu", "-J", self.tag, "-o", path, "--wrap", script])
        (job_id,) = await self._sbatch_many([line])
        return BenchJob(job_id=job_id, stdout_path=path, finishes=True)

    async def cancel_all(self) -> None:
        await self.hook.arun(["scancel", "-n", self.tag], check=False)

    async def remove_files(self) -> None:
        await self.hook.arun(["rm", "-rf", self.results_dir], check=False)
