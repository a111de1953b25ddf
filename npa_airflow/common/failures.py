"""The failure vocabulary shared by Slurm and Burst: a failed job is an infrastructure failure (retried) or the
program's own (not retried), and the log patterns that mark infrastructure.

Infrastructure: node failures, NCCL transport errors and collective timeouts, CUDA driver initialisation
failures, Xid errors, GPU / InfiniBand / NVLink link down, and the OOM killer reaping processes. Each backend
adds what only it knows (Slurm's NODE_FAIL state and the nodes to exclude, SkyPilot's failed launches): its
verdict (`slurm.failures.classify`, `burst.outcome.classify_burst_failure`) reads the log tail through
`infra_lines` and words the evidence with `evidence_parts`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["infra", "program"]
MAX_EVIDENCE_LINES = 3
MAX_EVIDENCE_LINE = 300


@dataclass(frozen=True)
class FailureVerdict:
    kind: FailureKind
    evidence: str
    bad_nodes: tuple[str, ...] = ()

    @property
    def is_infra(self) -> bool:
        return self.kind == "infra"


INFRA_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(pattern, re.IGNORECASE))
    for label, pattern in (
        ("node failure", r"\bNode failure on\b|\bNODE_FAIL\b|\bnode .* (?:not responding|is down)\b"),
        (
            "NCCL transport error",
            r"NCCL WARN .*(?:NET/|transport|socket|ibv_|connection (?:closed|reset|refused))"
            r"|\bncclSystemError\b|\bncclRemoteError\b|\bunhandled system error\b.*NCCL|NCCL error.*(?:system|remote)"
            r"|transport/net_ib|\bNET/IB\b.*(?:error|fail)|\bibv_\w+ failed",
        ),
        (
            "NCCL collective timeout",
            r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout|NCCL (?:communicator )?"
            r"(?:timeout|was aborted)|\bcollective operation timeout\b",
        ),
        # before the CUDA patterns: an Xid line often also says "GPU has fallen off the bus"
        ("Xid error", r"(?-i:\bNVRM: Xid\b|\bXid\s*(?:\(PCI:[^)]*\))?\s*:?\s*\d+)"),
        (
            "CUDA driver initialisation failure",
            r"CUDA driver initiali[sz]ation failed|cudaErrorInitializationError|CUDA error: initiali[sz]ation error"
            r"|CUDA_ERROR_(?:NO_DEVICE|NOT_INITIALIZED)|\bcuInit\b.*(?:fail|error)|No CUDA GPUs are available"
            r"|(?:Failed to|unable to) initiali[sz]e NVML|NVIDIA-SMI has failed|GPU has fallen off the bus"
            r"|uncorrectable ECC error",
        ),
        (
            "GPU/IB link down",
            r"\b(?:mlx\d?_\d+|ib\d+|hca|infiniband|port \d+|nvlink)\b.*\b(?:link (?:is )?down|state:? ?down)\b"
            r"|\blink (?:is )?down\b.*\b(?:mlx\d?_\d+|ib\d+|nvlink|infiniband)\b|NVLink.*(?:inactive|error)",
        ),
        (
            "OOM killer",
            r"Out of memory: Kill(?:ed)? process|\boom[-_]kill(?:er)?\b|\boom_reaper\b|\boom-kill event",
        ),
    )
)


def infra_lines(log_tail: str) -> list[tuple[str, str]]:
    """``(label, line)`` for each line of ``log_tail`` that shows an infrastructure failure (first pattern wins),
    the line stripped but whole: a backend may read more from it (Slurm: the node it names)."""
    matches = []
    for line in log_tail.splitlines():
        label = next((label for label, pattern in INFRA_PATTERNS if pattern.search(line)), None)
        if label is not None:
            matches.append((label, line.strip()))
    return matches


def evidence_parts(matches: Sequence[tuple[str, str]]) -> list[str]:
    """``"label: line"`` for the first MAX_EVIDENCE_LINES of ``infra_lines``' matches, each line cut short."""
    return [f"{label}: {line[:MAX_EVIDENCE_LINE]}" for label, line in matches[:MAX_EVIDENCE_LINES]]
