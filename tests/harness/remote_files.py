"""Put files on the cluster and read them back with the provider's own builders, for tests that need fixtures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npa_airflow.slurm.submit.staging import StagedFile, build_stage


async def aput_files(hook: Any, files: Sequence[StagedFile]) -> None:
    """Write ``files`` (atomically, with their modes) in one round trip, as staging does before sbatch."""
    command, stdin = build_stage(files)
    await hook.arun(command, stdin=stdin, check=True)


def put_files(hook: Any, files: Sequence[StagedFile]) -> None:
    command, stdin = build_stage(files)
    hook.run(command, stdin=stdin, check=True)


async def aread_from(hook: Any, path: str, offset: int) -> tuple[bytes, int]:
    """New bytes of one file from ``offset`` and the offset after them, as the log tail reads them."""
    chunk = (await hook.atail_logs([(path, offset)]))[0]
    return chunk.data, chunk.offset


def read_from(hook: Any, path: str, offset: int) -> tuple[bytes, int]:
    chunk = hook.tail_logs([(path, offset)])[0]
    return chunk.data, chunk.offset
