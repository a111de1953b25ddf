"""Scripted `sacct`, `squeue` and `scontrol` first on PATH, and a SlurmHook whose commands run in local bash
around them: the hook's real command lines (batches, end-record tests, the --only-job-state check) against
answers recorded on the test clusters. Each tool logs its arguments to `<tool>.log`."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from npa_airflow.slurm.transport.ssh import CommandResult

# `squeue --help`, the line that matters: 24.11 lists it, 22.05 does not.
HELP_2411 = "      --only-job-state            Only query job state\n"
HELP_2205 = "  -p, --partition=partition(s)    comma separated list of partitions\n"
TOOLS = ("sacct", "squeue", "scontrol")


class ScriptedSlurmTools:
    """`answers`: {tool: (exit code, stdout, stderr)}, (0, "", "") for a tool not given; `squeue --help` prints
    `help_text`; the hook has connection settings `config`."""

    def __init__(
        self,
        tmp_path: Path,
        answers: Mapping[str, tuple[int, str, str]],
        config: SlurmConnectionConfig,
        help_text: str = HELP_2205,
    ) -> None:
        self.config = config
        self.dir = tmp_path / "tools"
        self.bin = self.dir / "bin"
        self.bin.mkdir(parents=True)
        for tool in TOOLS:
            rc, out, err = answers.get(tool, (0, "", ""))
            (self.dir / f"{tool}.out").write_text(out)
            (self.dir / f"{tool}.err").write_text(err)
            base = shlex.quote(str(self.dir / tool))
            help_line = f'[ "$1" != --help ] || {{ printf %s {shlex.quote(help_text)}; exit 0; }}\n'
            script = self.bin / tool
            script.write_text(
                "#!/bin/bash\n"
                + (help_line if tool == "squeue" else "")
                + f'printf "%s\\n" "$*" >> {base}.log\ncat {base}.out; cat {base}.err >&2\nexit {rc}\n'
            )
            script.chmod(0o755)
        self.round_trips: list[str] = []

    def calls(self, tool: str) -> list[str]:
        log = self.dir / f"{tool}.log"
        return log.read_text().splitlines() if log.exists() else []

    def hook(self, cluster: str | None = None) -> SlurmHook:
        hook = SlurmHook(config=self.config, cluster=cluster)
        env = {"PATH": f"{self.bin}:/usr/bin:/bin"}

        async def arun(argv, *, stdin=None, check=True, **kwargs):
            command = argv if isinstance(argv, str) else shlex.join(argv)
            self.round_trips.append(command)
            proc = await asyncio.create_subprocess_exec(
                "bash", "-c", command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            out, err = await proc.communicate(stdin or b"")
            return CommandResult(stdout=out, stderr=err, returncode=proc.returncode, host="login1")

        hook.arun = arun  # type: ignore[method-assign]
        return hook
