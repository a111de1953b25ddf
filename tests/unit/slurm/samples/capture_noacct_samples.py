"""Record real output of a Slurm site without accounting (no slurmdbd) into ``22.05-noacct/``.

Run against the bed without accounting (``dev/cluster --no-accounting up``):

    NPA_SLURM_ACCOUNTING=none .venv/bin/python tests/unit/slurm/samples/capture_noacct_samples.py

It records what sacct answers there (the error), squeue's view of ended jobs while slurmctld keeps them
(MinJobAge) and after it has forgotten them, and ``scontrol show job`` of an ended job. Nothing here runs during
pytest.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from npa_airflow.slurm import commands as c

HERE = Path(__file__).parent
CLUSTER = Path(__file__).resolve().parents[4] / "dev" / "cluster"
PREFIX = "npa-sample"


def bed_env() -> dict[str, str]:
    out = subprocess.run([str(CLUSTER), "env"], check=True, capture_output=True, text=True).stdout
    return {
        k.removeprefix("export "): shlex.split(v)[0] if v else ""
        for k, _, v in (x.partition("=") for x in out.splitlines())
    }


ENV = bed_env()
if ENV.get("NPA_SLURM_ACCOUNTING") != "none":
    sys.exit("not the bed without accounting: run with NPA_SLURM_ACCOUNTING=none")
OUT = HERE / f"{ENV['NPA_SLURM_VERSION']}-noacct"
SSH = [
    "ssh", "-F", "/dev/null",
    "-i", ENV["NPA_SSH_KEY"],
    "-o", f"UserKnownHostsFile={ENV['NPA_KNOWN_HOSTS']}",
    "-o", "BatchMode=yes",
    "-p", ENV["NPA_SSH_PORT"],
    f"{ENV['NPA_SSH_USER']}@127.0.0.1",
]  # fmt: skip


def remote(command: list[str] | str) -> subprocess.CompletedProcess[str]:
    line = command if isinstance(command, str) else shlex.join(command)
    return subprocess.run([*SSH, line], capture_output=True, timeout=60, check=False, text=True)


def framed(result: subprocess.CompletedProcess[str]) -> str:
    return f"rc={result.returncode}\nstdout={result.stdout!r}\nstderr={result.stderr!r}\n"


def submit(name: str, *args: str) -> str:
    argv = ["sbatch", "--parsable", "-p", "cpu", "-J", f"{PREFIX}-{name}", "-o", "/dev/null", *args]
    proc = remote(argv)
    if proc.returncode != 0:
        sys.exit(f"sbatch {name} failed: {proc.stderr}")
    return c.parse_sbatch_submit(proc.stdout).job_id


def save(name: str, text: str) -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / name).write_text(text)
    print(f"wrote {OUT.name}/{name} ({len(text.splitlines())} lines)")


def main() -> None:
    ok = submit("ok", "--wrap", "echo hello")
    fail = submit("exit7", "--wrap", "exit 7")
    killed = submit("signal", "--wrap", "kill -9 $$")
    cancel = submit("cancel", "--wrap", "sleep 120")
    held = submit("held", "--hold", "--wrap", "true")
    running = submit("running", "--wrap", "sleep 120")
    ids = [ok, fail, killed, cancel, held, running]
    time.sleep(4)
    remote(["scancel", cancel])
    time.sleep(4)
    save("sacct_states.txt", framed(remote(c.build_sacct_states(ids))))
    save("sacct_find_by_name.txt", framed(remote(c.build_find_by_name_sacct([f"{PREFIX}-ok"], ENV["NPA_SSH_USER"]))))
    save("squeue_states.txt", remote(c.build_squeue_states(ids)).stdout)
    save("scontrol_job_failed.txt", remote(["scontrol", "-o", "show", "job", fail]).stdout)
    save("scontrol_job_completed.txt", remote(["scontrol", "-o", "show", "job", ok]).stdout)
    save("scontrol_job_cancelled.txt", remote(["scontrol", "-o", "show", "job", cancel]).stdout)
    # After MinJobAge (plus slurmctld's purge interval) the ended jobs are gone: squeue names only the live ones.
    age = int(os.environ.get("NPA_SLURM_MIN_JOB_AGE", ENV.get("NPA_SLURM_MIN_JOB_AGE", "30")))
    deadline = time.monotonic() + age + 150
    while time.monotonic() < deadline:
        if ok not in c.parse_squeue(remote(c.build_squeue_states(ids)).stdout):
            break
        time.sleep(5)
    save("squeue_states_purged.txt", remote(c.build_squeue_states(ids)).stdout)
    save("squeue_purged_single.txt", framed(remote(c.build_squeue_states([ok]))))
    save("scontrol_job_purged.txt", framed(remote(["scontrol", "-o", "show", "job", ok])))
    remote(["scancel", held, running])
    print("job ids:", ids)


if __name__ == "__main__":
    main()
