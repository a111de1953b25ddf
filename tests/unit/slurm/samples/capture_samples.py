"""Record real sbatch / sacct / squeue / scancel / scontrol output from a local cluster into this folder.

Run against a running bed (``dev/cluster [--slurm VERSION] up``); the output goes to ``<VERSION>/``:

    .venv/bin/python tests/unit/slurm/samples/capture_samples.py [--slurm 24.11] [find | preempt]

It submits a handful of tiny CPU jobs (complete, exit 7, killed by a signal, cancelled while running,
held, array, het, requeued) and one GPU job (2 nodes x 8 GPUs), waits for them to settle and writes each tool's
output, built by the same builders the hook uses, to ``*.txt`` files that the parser tests read (for every version
recorded). The bed is the one `dev/cluster env` names (``--slurm`` or NPA_SLURM_VERSION choose it). Nothing here
runs during pytest.

Written by hand, until recorded again on both beds: the ElapsedRaw and AllocTRES columns of sacct_states.txt and
sacct_requeue_duplicates.txt (the state query reads them for the jobs' GPU-hours) and the npa-sample-gpus line,
AllocTRES from what the bed's jobcomp.txt records for the same requests, in sacct's order.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from npa_airflow.slurm import commands as c

HERE = Path(__file__).parent
CLUSTER = Path(__file__).resolve().parents[4] / "dev" / "cluster"
PREFIX = "npa-sample"


def bed_env(args: list[str]) -> dict[str, str]:
    """The bed's settings from `dev/cluster env` (the one NPA_SLURM_VERSION, or `--slurm` in `args`, names)."""
    out = subprocess.run([str(CLUSTER), *args, "env"], check=True, capture_output=True, text=True).stdout
    return {k.removeprefix("export "): shlex.split(v)[0] for k, _, v in (x.partition("=") for x in out.splitlines())}


ARGS = sys.argv[1:]
BED_ARGS = ARGS[:2] if ARGS[:1] == ["--slurm"] else []
MODE = ARGS[len(BED_ARGS) :]
ENV = bed_env(BED_ARGS)
OUT = HERE / ENV["NPA_SLURM_VERSION"]
SSH = [
    "ssh", "-F", "/dev/null",
    "-i", ENV["NPA_SSH_KEY"],
    "-o", f"UserKnownHostsFile={ENV['NPA_KNOWN_HOSTS']}",
    "-o", "BatchMode=yes",
    "-p", ENV["NPA_SSH_PORT"],
    f"{ENV['NPA_SSH_USER']}@127.0.0.1",
]  # fmt: skip


def remote(command: list[str] | str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    line = command if isinstance(command, str) else shlex.join(command)
    return subprocess.run([*SSH, line], input=stdin, capture_output=True, timeout=60, check=False, text=stdin is None)


def submit(name: str, *args: str, script: str | None = None, partition: str = "cpu") -> str:
    argv = ["sbatch", "--parsable", "-p", partition, "-J", f"{PREFIX}-{name}", "-o", "/dev/null", *args]
    proc = subprocess.run(
        [*SSH, shlex.join(argv)], input=script, capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"sbatch {name} failed: {proc.stderr}")
    return c.parse_sbatch_submit(proc.stdout).job_id


def save(name: str, text: str) -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / name).write_text(text)
    print(f"wrote {OUT.name}/{name} ({len(text.splitlines())} lines)")


def wait_for(job_id: str, states: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = c.parse_squeue(remote(c.build_squeue_states([job_id])).stdout).get(job_id)
        if info and info.native_state in states:
            return
        time.sleep(0.3)
    sys.exit(f"job {job_id} did not reach {states}")


def main() -> None:
    sbatch_outputs = []
    ok = submit("ok", "--wrap", "echo hello")
    fail = submit("exit7", "--wrap", "exit 7")
    killed = submit("signal", "--wrap", "kill -9 $$")
    cancel = submit("cancel", "--wrap", "sleep 120")
    held = submit("held", "--hold", "--wrap", "true")
    array = submit("array", "--array=1-3", "--wrap", "sleep 2")
    het = submit("het", script="#!/bin/bash\n#SBATCH -n1\n#SBATCH hetjob\n#SBATCH -n1\nsrun true\n")
    requeue = submit("requeue", "--requeue", "--wrap", "sleep 120")
    # AllocTRES with gres/gpu and node: the GPU-hours of the state query (the bed tracks gres/gpu)
    gpus = submit("gpus", "-N", "2", "--gpus-per-node=8", "--wrap", "sleep 2", partition="gpu")
    sbatch_outputs.append(remote(["sbatch", "--parsable", "-p", "cpu", "-o", "/dev/null", "--hold", "--wrap", "true"]))
    held_array = remote(
        ["sbatch", "--parsable", "-p", "cpu", "-o", "/dev/null", "--array=1-3", "--hold", "--wrap", "true"]
    )
    on_cluster = remote(
        ["sbatch", "--parsable", "-M", "npa", "-p", "cpu", "-o", "/dev/null", "--hold", "--wrap", "true"]
    )
    ids = [ok, fail, killed, cancel, held, array, het, requeue, gpus]

    wait_for(cancel, {"RUNNING"})
    wait_for(requeue, {"RUNNING"})
    remote(["scancel", cancel])
    remote(["scontrol", "requeue", requeue])
    time.sleep(8)

    save("sacct_states.txt", remote(c.build_sacct_states(ids)).stdout)
    save("squeue_states.txt", remote(c.build_squeue_states(ids)).stdout)
    only = remote(c.build_squeue_only_states(ids))  # 23.x and later; the error on 22.05
    save("squeue_only_states.txt", only.stdout if only.returncode == 0 else f"rc={only.returncode}\n{only.stderr}")
    save("squeue_pending_array.txt", remote(c.build_squeue_states([held_array.stdout.strip()])).stdout)
    save("sbatch_parsable_array.txt", held_array.stdout)
    save("sbatch_parsable_cluster.txt", on_cluster.stdout)
    capture_find_by_name()
    # The seed's fallback form: default column width truncates "CANCELLED by <uid>" to "CANCELLED+".
    save("sacct_default_width.txt", remote(["sacct", "-X", "-n", "-j", cancel, "-o", "JobID,State"]).stdout)

    purged = remote(["squeue", "-h", "-t", "all", "--jobs=999999", "-o", c.SQUEUE_FORMAT])
    save("squeue_invalid_id.txt", f"rc={purged.returncode}\nstdout={purged.stdout!r}\nstderr={purged.stderr!r}\n")
    finished = remote(c.build_cancel(ok))
    save("scancel_finished.txt", f"rc={finished.returncode}\nstdout={finished.stdout!r}\nstderr={finished.stderr!r}\n")
    gone = remote(c.build_cancel("999999"))
    save("scancel_invalid.txt", f"rc={gone.returncode}\nstdout={gone.stdout!r}\nstderr={gone.stderr!r}\n")

    save("scontrol_nodes.txt", remote(c.build_scontrol_nodes()).stdout)
    save("scontrol_partitions.txt", remote(c.build_partitions()).stdout)
    save("sbatch_parsable.txt", "".join(p.stdout for p in sbatch_outputs))

    remote(["scancel", held, requeue, sbatch_outputs[0].stdout.strip(), held_array.stdout.strip()])
    remote(["scancel", "-M", "npa", on_cluster.stdout.strip().split(";")[0]])
    time.sleep(5)
    # A requeued job's records, oldest first: the run that was requeued, then the current one (cancelled above).
    duplicates = [*c.build_sacct_states([requeue])[:-2], "--duplicates", "-j", requeue]
    save("sacct_requeue_duplicates.txt", remote(duplicates).stdout)
    print("job ids:", ids)


def capture_find_by_name() -> None:
    """Name lookups: this user's jobs of given names with their submit time and comment (the owner proof), one
    comment holding the field separator. `capture_samples.py find` records only these."""
    proof = "npa1:-:0123456789abcdef01234567"
    done = submit("find-ok", "--comment", proof, "--wrap", "true")
    held = submit("find-held", "--hold", "--comment", "made|by hand", "--wrap", "true")
    time.sleep(8)
    names = [f"{PREFIX}-find-ok", f"{PREFIX}-find-held"]
    save("sacct_find_by_name.txt", remote(c.build_find_by_name_sacct(names, "npa")).stdout)
    save("squeue_find_by_name.txt", remote(c.build_find_by_name_squeue(names, "npa")).stdout)
    remote(["scancel", held])
    print("find-by-name job ids:", done, held)


def capture_preemption() -> None:
    """A job of the gpu partition preempted by one of the urgent partition (the bed's PreemptType=partition_prio,
    PreemptMode=REQUEUE, GraceTime=10; recorded with 20): with --requeue it is requeued under its id, without it it
    ends PREEMPTED.
    The state query's answers while the preemption kills it (``*_ending``) and after (``*_ended``).
    `capture_samples.py preempt` records only these (about two minutes)."""
    for kind, flag in (("requeue", "--requeue"), ("cancel", "--no-requeue")):
        # A command that checkpoints on SIGTERM, as a training run does in the grace time.
        wrap = "trap 'sleep 10; exit 0' TERM; sleep 300 & wait"
        victim = submit(f"preempted-{kind}", flag, "-N", "2", "--gpus-per-node=8", "--wrap", wrap, partition="gpu")
        wait_for(victim, {"RUNNING"})
        urgent = submit("urgent", "-N", "2", "--gpus-per-node=8", "-t", "1", "--wrap", "sleep 5", partition="urgent")
        wait_for(victim, {"COMPLETING", "PREEMPTED"}, timeout=90)
        save(f"preempted_{kind}_ending_sacct.txt", remote(c.build_sacct_states([victim])).stdout)
        save(f"preempted_{kind}_ending_squeue.txt", remote(c.build_squeue_states([victim])).stdout)
        wait_for(victim, {"PREEMPTED", "PENDING"}, timeout=60)
        time.sleep(3)
        save(f"preempted_{kind}_ended_sacct.txt", remote(c.build_sacct_states([victim])).stdout)
        save(f"preempted_{kind}_ended_squeue.txt", remote(c.build_squeue_states([victim])).stdout)
        remote(["scancel", victim, urgent])
        print(f"preempted ({kind}) job id:", victim)
        time.sleep(5)


if __name__ == "__main__":
    {"find": capture_find_by_name, "preempt": capture_preemption}.get(" ".join(MODE), main)()
