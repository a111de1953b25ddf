"""A SlurmHook that records every remote command it sends: what kind, how many job ids, how many bytes came back."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from npa_airflow.slurm.commands import TAIL_MARK
from npa_airflow.slurm.hook import CommandResult, SlurmHook


@dataclass
class Call:
    cycle: int
    kind: str
    job_ids: int
    stdout_bytes: int


class CountingHook(SlurmHook):
    """SlurmHook that records every remote command it sends (kind, ids carried, bytes received)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[Call] = []
        self.cycle = lambda: 0

    async def arun(self, argv, **kwargs) -> CommandResult:  # type: ignore[override]
        kind, ids = classify(argv)
        stdout_bytes = 0
        try:
            result = await super().arun(argv, **kwargs)
            stdout_bytes = len(result.stdout)
            return result
        finally:
            self.calls.append(Call(self.cycle(), kind, ids, stdout_bytes))


def classify(argv) -> tuple[str, int]:
    if isinstance(argv, str):
        if TAIL_MARK in argv:
            return "tail", 0
        if ".npa-offsets" in argv:
            return "offsets", 0
        _, sep, query = argv.rpartition("; exec ")
        if sep and query.startswith("sacct "):  # a state query looking for end records (slurm/commands/end_records.py)
            return classify(shlex.split(query))
        return "shell", 0
    name = argv[0]
    ids = 0
    for i, arg in enumerate(argv):
        if arg == "-j" and i + 1 < len(argv):
            ids = len(argv[i + 1].split(","))
        elif arg.startswith("--jobs="):
            ids = len(arg.split("=", 1)[1].split(","))
    return name, ids
