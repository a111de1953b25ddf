"""Infrastructure or program? Classify a failed Slurm job from its state and the tail of its log.

Infrastructure (retry on other nodes): NODE_FAIL / BOOT_FAIL, NCCL transport errors and collective
timeouts, CUDA driver initialisation failures, Xid errors, GPU / InfiniBand / NVLink link down, and the
OOM killer reaping processes. Anything else is the program's own failure and must not consume retries.

Bad nodes come from the evidence itself (NCCL's ``host:pid:tid`` prefix, ``srun: error: <node>:``,
``Node failure on <node>``); without such a hint, a NODE_FAIL/BOOT_FAIL or a single-node job blames its
allocated nodes. A retry excludes them only after :func:`validate_exclusions` checks that they exist:
excluding an unknown node makes sbatch itself fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from npa_airflow.common.failures import MAX_EVIDENCE_LINES, FailureVerdict, evidence_parts, infra_lines
from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.commands.states import BLAMELESS_NATIVE_STATES, INFRA_NATIVE_STATES

MAX_HOSTLIST = 4096


# Where a log line names its node.
_NODE_HINTS = (
    re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.-]*):\d+:\d+ \["),  # NCCL: "g1:1234:5678 [0] NCCL WARN ..."
    re.compile(r"\bsrun: error: ([A-Za-z][A-Za-z0-9_.-]*): task"),
    re.compile(r"\bNode failure on ([A-Za-z][A-Za-z0-9_.\[\],-]*)"),
    re.compile(r"\bnode ([A-Za-z][A-Za-z0-9_.-]*) (?:not responding|is down)\b", re.IGNORECASE),
    re.compile(r"\bslurmstepd: error: .* on (?:node |host )?([A-Za-z][A-Za-z0-9_.-]*)\b"),
)


def expand_hostlist(expression: str | None) -> list[str]:
    """``'g[1-2,5],c01'`` -> ``['g1', 'g2', 'g5', 'c01']`` (zero padding kept; several bracket groups ok)."""
    if not expression:
        return []
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", expression):
        names.extend(_expand_one(item.strip()))
        if len(names) > MAX_HOSTLIST:
            raise ValueError(f"hostlist {expression[:80]!r} expands to more than {MAX_HOSTLIST} names")
    return list(dict.fromkeys(n for n in names if n))


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    values: list[str] = []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        if not hi:
            values.append(lo)
            continue
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo) or int(hi) - int(lo) > MAX_HOSTLIST:
            return [item]  # not a range we understand: keep the text as is
        values.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return [name for v in values for name in _expand_one(head + v + tail)]


def _nodes_named_in(line: str) -> list[str]:
    nodes: list[str] = []
    for hint in _NODE_HINTS:
        for m in hint.finditer(line):
            nodes.extend(expand_hostlist(m.group(1).rstrip(".,")))
    return nodes


def classify(info: SlurmJobInfo, log_tail: str) -> FailureVerdict:
    """``infra`` (retryable on other nodes) or ``program`` (fail now), with the evidence that decided."""
    if info.state is JobState.CANCELED:
        return FailureVerdict("program", f"job {info.job_id} was cancelled ({info.native_state}); not retried")
    allocated = expand_hostlist(info.node_list)
    matches = infra_lines(log_tail)
    blamed = [node for _, line in matches for node in _nodes_named_in(line)]
    if allocated and blamed:
        # Only nodes of this job's allocation; a log line may name a peer or be garbled.
        blamed = [n for n in blamed if n in allocated] or blamed
    state_infra = info.native_state in INFRA_NATIVE_STATES
    if not state_infra and not matches:
        code = f", exit code {info.exit_code}" if info.exit_code is not None else ""
        signal = f", signal {info.signal}" if info.signal else ""
        return FailureVerdict(
            "program",
            f"job {info.job_id} ended {info.native_state or 'UNKNOWN'}{code}{signal}; no infrastructure "
            "pattern in the log tail",
        )
    parts = []
    if state_infra:
        parts.append(f"job state {info.native_state}")
    parts.extend(evidence_parts(matches))
    if len(matches) > MAX_EVIDENCE_LINES:
        parts.append(f"(+{len(matches) - MAX_EVIDENCE_LINES} more matching lines)")
    if info.native_state in BLAMELESS_NATIVE_STATES:
        blamed = []
    elif not blamed and (state_infra or len(allocated) == 1):
        blamed = allocated
    return FailureVerdict("infra", "; ".join(parts), tuple(dict.fromkeys(blamed)))


def validate_exclusions(bad_nodes: Iterable[str], known_nodes: Iterable[str] | Mapping[str, object]) -> tuple[str, ...]:
    """The bad nodes that exist on the cluster (``scontrol show nodes``), in order, without duplicates."""
    known = set(known_nodes)
    return tuple(dict.fromkeys(n for n in bad_nodes if n in known))
