"""Reading the text Slurm's tools print: their output quoted in an error (cut short), the lines that hold
records, ``Key=Value`` fields, and the words they print for "nothing"."""

from __future__ import annotations

import re
from collections.abc import Iterator

_OUTPUT_QUOTE_MAX = 400


def quote_output(text: str | bytes) -> str:
    """``text`` as an error message quotes it: repr'd, cut after a few hundred characters."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) > _OUTPUT_QUOTE_MAX:
        text = text[:_OUTPUT_QUOTE_MAX] + f"... ({len(text)} characters)"
    return repr(text)


def none_if(value: str, *empty: str) -> str | None:
    """``value`` stripped; None when it is blank or one of the tool's words for nothing (``empty``)."""
    value = value.strip()
    return None if not value or value in empty else value


def _is_cluster_banner(line: str) -> bool:
    # With -M, squeue (and some sacct builds) print "CLUSTER: name" before the rows.
    return line.startswith("CLUSTER: ")


def data_lines(stdout: str) -> Iterator[str]:
    """The lines of a Slurm tool's output that hold records (no blanks, no multi-cluster banners)."""
    return (line for line in stdout.splitlines() if line.strip() and not _is_cluster_banner(line))


def key_value(line: str, key: str) -> str | None:
    """The value of ``key=`` in a ``scontrol -o`` line (up to the next space); None when the key is absent."""
    m = re.search(rf"(?:^|\s){key}=(\S*)", line)
    return m.group(1) if m else None
