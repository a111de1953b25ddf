"""Submission: lint + stage script and sidecar + sbatch through the hook, vs one `ssh` invocation per step.

Ours: `lint_script` and `bash -n` run locally (before any remote side effect), then ONE
`SlurmHook.astage_and_submit` round trip creates the directory, writes the script and the mode-600 sidecar
atomically and runs sbatch. Measured cold (first call: includes opening the connection) and warm (pooled).
The operator reads before it, shown separately: the partitions and nodes for its pre-submit checks
(`acluster_layout`) and the earlier tries' jobs by name (`afind_jobs_by_name`: sacct + squeue), one batched
round trip each.

Baseline (the seed's shape): separate OpenSSH invocations, each a new connection: mkdir, write script,
write sidecar, `bash -n`, sbatch.

Jobs are submitted held (`--hold`) and cancelled at the end: nothing runs.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
import time

from benchmarks.cluster import ClusterEnv, SshdLog, local_port
from benchmarks.jobs import CONN_ID, BenchRun
from benchmarks.report import p50, pmax, table
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.submit.scripts import assert_script_clean, bash_syntax_check
from npa_airflow.slurm.submit.staging import StagedFile
from npa_airflow.slurm.transport import ssh

BASELINE_BIND = "127.0.0.3"  # the baseline's ssh clients connect from here, so sshd's log tells them apart


def _script(tag: str, results: str, sidecar: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "#SBATCH --partition=cpu",
            f"#SBATCH --job-name={tag}",
            f"#SBATCH --output={results}/%j.out",
            "#SBATCH --time=00:05:00",
            "set -euo pipefail",
            f"trap 'shred -u {shlex.quote(sidecar)} 2>/dev/null || rm -f {shlex.quote(sidecar)}' EXIT",
            f"set -a; . {shlex.quote(sidecar)}; set +a",
            'echo "training step on $(hostname)"',
            "",
        ]
    )


async def _ours_once(hook: SlurmHook, run: BenchRun, index: int) -> tuple[float, str]:
    directory = f"{run.results_dir}/ours-{index}"
    script_path, sidecar = f"{directory}/job.sbatch", f"{directory}/job.env"
    started = time.monotonic()
    script = _script(run.tag, directory, sidecar)
    assert_script_clean(script, ["benchmark-session-credential"])
    bash_syntax_check(script)
    result = await hook.astage_and_submit(
        [
            StagedFile(sidecar, b"HF_TOKEN=benchmark-session-credential\n", 0o600),
            StagedFile(script_path, script.encode()),
        ],
        script_path,
        sbatch_args=["--hold"],
        mkdirs=[directory],
    )
    return time.monotonic() - started, result.job_id


def _baseline_once(env: ClusterEnv, run: BenchRun, index: int) -> tuple[float, str]:
    directory = f"{run.results_dir}/seed-{index}"
    script_path, sidecar = f"{directory}/job.sbatch", f"{directory}/job.env"
    script = _script(run.tag, directory, sidecar)
    q = shlex.quote
    steps: list[tuple[str, bytes | None]] = [
        (f"mkdir -p {q(directory)}", None),
        (f"cat > {q(script_path)}", script.encode()),
        (f"umask 077; cat > {q(sidecar)}", b"HF_TOKEN=benchmark-session-credential\n"),
        (f"bash -n {q(script_path)}", None),
        (f"sbatch --parsable --hold {q(script_path)}", None),
    ]
    started = time.monotonic()
    out = b""
    for command, stdin in steps:
        out = subprocess.run(
            env.ssh_argv(command, bind=BASELINE_BIND), input=stdin, capture_output=True, check=True, timeout=120
        ).stdout
    return time.monotonic() - started, out.decode().strip().split(";")[0]


async def run(env: ClusterEnv, reps: int) -> dict:
    print("... submission", file=sys.stderr, flush=True)
    sshd = SshdLog(env.sshd_log)
    hook = SlurmHook(CONN_ID)
    admin = SlurmHook(CONN_ID)  # same pool: its setup commands run before the marks
    run_ = BenchRun(admin, env.shared, "submit")
    rows, raw = [], {}
    try:
        # ours, cold: the first call opens the pooled connection
        await asyncio.sleep(0)
        mark, connects0 = sshd.mark(), ssh.loop_pool().connects
        cold, _ = await _ours_once(hook, run_, 0)
        ports = {local_port(c) for c, _ in ssh.loop_pool().connections.values()}
        conns, sessions = sshd.since(mark).count(ports=ports)
        rows.append(["hook, cold (connects)", 1, conns, sessions, cold * 1000, cold * 1000])
        raw["ours_cold"] = {"seconds": cold, "connections": conns, "sessions": sessions}

        mark, warm = sshd.mark(), []
        for i in range(1, reps + 1):
            seconds, _ = await _ours_once(hook, run_, i)
            warm.append(seconds)
        conns, sessions = sshd.since(mark).count(ports=ports)
        opened = ssh.loop_pool().connects - connects0 - 1
        rows.append(["hook, warm (pooled)", reps, opened, sessions / reps, p50(warm) * 1000, pmax(warm) * 1000])
        raw["ours_warm"] = {"seconds": warm, "sessions": sessions, "connections_opened": opened}

        # what the operator does on top: its pre-submit checks and the lookup by job name, then the same submit
        mark, op = sshd.mark(), []
        for i in range(reps + 1, 2 * reps + 1):
            started = time.monotonic()
            await hook.acluster_layout()
            await hook.afind_jobs_by_name([f"{run_.tag}-none"])
            await _ours_once(hook, run_, i)
            op.append(time.monotonic() - started)
        _, sessions = sshd.since(mark).count(ports=ports)
        rows.append(
            [
                "operator path (checks + lookup + submit), warm",
                reps,
                0,
                sessions / reps,
                p50(op) * 1000,
                pmax(op) * 1000,
            ]
        )
        raw["operator_warm"] = {"seconds": op, "sessions": sessions}

        mark, base = sshd.mark(), []
        for i in range(reps):
            seconds, _ = await asyncio.to_thread(_baseline_once, env, run_, i)
            base.append(seconds)
        conns, sessions = sshd.since(mark).count(address=BASELINE_BIND)
        rows.append(
            ["baseline: ssh per step", reps, conns / reps, sessions / reps, p50(base) * 1000, pmax(base) * 1000]
        )
        raw["baseline"] = {"seconds": base, "connections": conns, "sessions": sessions}
    finally:
        await run_.cancel_all()
        await run_.remove_files()
    print(
        table(
            "Submission (lint + mkdir + script + sidecar + sbatch)",
            ["path", "reps", "SSH connections opened per submit", "round trips per submit", "p50 ms", "max ms"],
            rows,
            "Round trips = SSH command sessions sshd logged for the client. Lint and `bash -n` run locally "
            "in the hook path (inside the timed span); the baseline runs `bash -n` remotely.",
        )
    )
    return raw
