"""Parsers of what the cluster is made of: ``scontrol show node`` and ``show partition`` records, a node's
Gres GPUs and Slurm time limits. Each raises NpaParseError quoting the input it could not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm.commands import records
from npa_airflow.slurm.commands.output_text import data_lines, key_value, none_if, quote_output


def _scontrol_records(stdout: str, name_key: str, value_key: str, what: str) -> Iterator[tuple[str, str, str]]:
    """(line, name, value) of each ``scontrol show -o`` record, which must carry both keys."""
    for line in data_lines(stdout):
        name = key_value(line, name_key)
        value = key_value(line, value_key)
        if not name or value is None:
            raise NpaParseError(f"scontrol {what} line without {name_key}/{value_key}: {quote_output(line)}")
        yield line, name, value


def parse_scontrol_nodes(stdout: str) -> dict[str, records.NodeInfo]:
    nodes: dict[str, records.NodeInfo] = {}
    for line, name, state in _scontrol_records(stdout, "NodeName", "State", "node"):
        parts = key_value(line, "Partitions")
        # Reason may contain spaces ("test [root@2026-01-01T00:00:00]"); it runs to the next Key= field.
        m = re.search(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Za-z]+=|$)", line)
        nodes[name] = records.NodeInfo(
            name=name,
            state=state,
            partitions=tuple(p for p in (parts or "").split(",") if p and p != "(null)"),
            reason=none_if(m.group(1)) if m else None,
            gpus=parse_gres_gpus(key_value(line, "Gres") or ""),
            real_memory_mb=_count(key_value(line, "RealMemory")),
        )
    return nodes


def _count(value: str | None) -> int | None:
    """A scontrol count: digits -> int; UNLIMITED, N/A, absent -> None."""
    return int(value) if value and value.isdigit() else None


def parse_gres_gpus(gres: str) -> int:
    """GPUs in a node's Gres: ``gpu:8``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2,gpu:v100:2``, ``gpu`` (1); else 0."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 1:
            total += 1
        elif parts[-1].isdigit():
            total += int(parts[-1])
        else:
            raise NpaParseError(f"cannot read the GPU count of Gres {quote_output(gres)}")
    return total


def parse_slurm_minutes(text: str) -> int | None:
    """Slurm time limit -> whole minutes (seconds round up); UNLIMITED/INFINITE -> None.

    Formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
    """
    value = text.strip()
    if value.upper() in {"UNLIMITED", "INFINITE", "NONE"}:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not m:
        raise NpaParseError(f"cannot read Slurm time limit {quote_output(text)}")
    days, a, b, c = m.groups()
    if days is not None:  # D-H[:M[:S]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:M:S
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # M:S
        seconds = int(a) * 60 + int(b)
    else:  # M
        seconds = int(a) * 60
    return -(-seconds // 60)


def parse_partitions(stdout: str) -> dict[str, records.PartitionInfo]:
    partitions: dict[str, records.PartitionInfo] = {}
    for line, name, max_time in _scontrol_records(stdout, "PartitionName", "MaxTime", "partition"):
        partitions[name] = records.PartitionInfo(
            name=name,
            max_time_minutes=parse_slurm_minutes(max_time),
            default=(key_value(line, "Default") or "").upper() == "YES",
            state=key_value(line, "State") or "",
            nodes=none_if(key_value(line, "Nodes") or "", "(null)"),
            total_nodes=_count(key_value(line, "TotalNodes")),
            max_nodes=_count(key_value(line, "MaxNodes")),
        )
    return partitions
