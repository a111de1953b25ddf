"""Infra-vs-program classification on realistic log lines, and exclusion validation."""

from __future__ import annotations

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.commands.states import interpret_native_state
from npa_airflow.slurm.watch.failures import FailureVerdict, classify, expand_hostlist, validate_exclusions


def info(native: str = "FAILED", nodes: str | None = "g[1-2]", exit_code: int | None = 1) -> SlurmJobInfo:
    return SlurmJobInfo(
        job_id="77", native_state=native, state=interpret_native_state(native), exit_code=exit_code, signal=0,
        job_name="npa-x-t1", node_list=nodes, reason=None, source="sacct",
    )  # fmt: skip


TRAINING_NOISE = """\
Epoch 3/10: 100%|##########| 500/500 [01:02<00:00, loss=0.231]
INFO:root:saving checkpoint to /lustre/results/ckpt-3.pt
"""


@pytest.mark.parametrize(
    ("line", "label", "nodes"),
    [
        (
            "g2:18231:18290 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.12<42>"
            " with error 12, opcode 0, len 0, vendor err 129",
            "NCCL transport error",
            ("g2",),
        ),
        (
            "g1:3342:3401 [0] NCCL WARN NET/Socket : peer 10.0.0.11<37121> message truncated",
            "NCCL transport error",
            ("g1",),
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.5 ncclSystemError",
            "NCCL transport error",
            (),
        ),
        (
            "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=4412, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600041 milliseconds",
            "NCCL collective timeout",
            (),
        ),
        (
            "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.",
            "CUDA driver initialisation failure",
            (),
        ),
        ("RuntimeError: No CUDA GPUs are available", "CUDA driver initialisation failure", ()),
        (
            "Failed to initialize NVML: Driver/library version mismatch",
            "CUDA driver initialisation failure",
            (),
        ),
        (
            "[Mon Dec  2 11:02:13 2026] NVRM: Xid (PCI:0000:b7:00): 79, pid=12345, name=python, "
            "GPU has fallen off the bus.",
            "Xid error",
            (),
        ),
        ("mlx5_0: Port 1 link down", "GPU/IB link down", ()),
        ("kernel: ib0: link is down", "GPU/IB link down", ()),
        ("[12345.678] Out of memory: Killed process 4242 (python) total-vm:92345676kB", "OOM killer", ()),
        (
            "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=77.0. Some of your processes may have been "
            "killed by the cgroup out-of-memory handler.",
            "OOM killer",
            (),
        ),
        ("srun: error: Node failure on g2", "node failure", ("g2",)),
    ],
)
def test_infra_patterns(line, label, nodes):
    # A 2-node job: only a line that names its node blames it; srun's exit line is not evidence.
    verdict = classify(info(), TRAINING_NOISE + line + "\n" + "srun: error: g1: task 0: Exited with exit code 1\n")
    assert verdict.kind == "infra"
    assert verdict.evidence.startswith(f"{label}: ")
    assert line.strip()[:60] in verdict.evidence
    assert verdict.bad_nodes == nodes


def test_nccl_evidence_blames_the_named_node_only():
    line = "g2:18231:18290 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion with error 12"
    verdict = classify(info(), TRAINING_NOISE + line)
    assert verdict == FailureVerdict("infra", f"NCCL transport error: {line}", ("g2",))


def test_node_fail_state_blames_the_allocation_without_log_evidence():
    verdict = classify(info("NODE_FAIL", nodes="g[1-2]", exit_code=0), "")
    assert verdict.kind == "infra"
    assert verdict.evidence == "job state NODE_FAIL"
    assert verdict.bad_nodes == ("g1", "g2")
    assert classify(info("BOOT_FAIL", nodes="c1"), TRAINING_NOISE).bad_nodes == ("c1",)


def test_single_node_infra_blames_its_node():
    verdict = classify(info(nodes="g1"), "RuntimeError: No CUDA GPUs are available\n")
    assert verdict.bad_nodes == ("g1",)


def test_multi_node_infra_without_a_named_node_blames_nobody():
    verdict = classify(info(nodes="g[1-2]"), "RuntimeError: No CUDA GPUs are available\n")
    assert verdict.kind == "infra" and verdict.bad_nodes == ()


@pytest.mark.parametrize(
    ("native", "log", "exit_code"),
    [
        ("FAILED", TRAINING_NOISE + "Traceback (most recent call last):\nKeyError: 'learning_rate'\n", 1),
        ("FAILED", "python: can't open file '/workspace/train.py': [Errno 2] No such file or directory\n", 2),
        ("FAILED", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", 1),
        ("TIMEOUT", TRAINING_NOISE + "slurmstepd: error: *** JOB 77 ON g1 CANCELLED DUE TO TIME LIMIT ***\n", 0),
        ("FAILED", "ValueError: xid must be positive\nsorting by taxid 12\n", 3),
        ("OUT_OF_MEMORY", "", 0),
    ],
)
def test_program_failures(native, log, exit_code):
    verdict = classify(info(native, exit_code=exit_code), log)
    assert verdict.kind == "program"
    assert verdict.bad_nodes == ()
    assert native in verdict.evidence and "no infrastructure pattern" in verdict.evidence


def test_cancelled_is_never_retried_even_with_infra_lines():
    verdict = classify(info("CANCELLED"), "NCCL WARN NET/IB : error\n")
    assert (verdict.kind, verdict.is_infra) == ("program", False)
    assert info("CANCELLED").state is JobState.CANCELED


def test_evidence_is_bounded():
    log = "\n".join(f"g1:1:{i} [0] NCCL WARN NET/IB : error {i} " + "x" * 1000 for i in range(20))
    verdict = classify(info(), log)
    assert "(+17 more matching lines)" in verdict.evidence
    assert len(verdict.evidence) < 1200


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("g[1-2]", ["g1", "g2"]),
        ("gpu[01-03,07],c1", ["gpu01", "gpu02", "gpu03", "gpu07", "c1"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("c1", ["c1"]),
        ("", []),
        (None, []),
        ("odd[a-b]", ["odd[a-b]"]),
    ],
)
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


def test_expand_hostlist_is_bounded():
    with pytest.raises(ValueError, match="more than"):
        expand_hostlist("n[1-4000],m[1-4000]")


def test_validate_exclusions():
    known = {"c1": object(), "g1": object(), "g2": object()}
    assert validate_exclusions(["g2", "gx", "g2", "g1"], known) == ("g2", "g1")
    assert validate_exclusions(["g9"], ["c1"]) == ()
