"""Byte chunks of a job's log file turned into the lines a trigger writes to the task log."""

from __future__ import annotations

import re

from npa_airflow.common import log_lines

MAX_PARTIAL_LINE = 64 * 1024  # a "line" longer than this is written out without waiting for its newline
_NEWLINE = re.compile(rb"\n")


class LogFileLines:
    """The lines of one log file from chunks read at known offsets, decoded; a partial last line waits for the next
    chunk and is not `committed` (the offset persisted for a resumed trigger)."""

    def __init__(self, offset: int) -> None:
        self._lines: log_lines.LineSplitter[bytes] = log_lines.LineSplitter(
            _NEWLINE, offset=offset, max_partial=MAX_PARTIAL_LINE
        )

    @property
    def committed(self) -> int:
        return self._lines.committed

    def feed(self, data: bytes, end_offset: int) -> list[str]:
        return [_text(line) for line in self._lines.feed(data, end_offset)]

    def flush(self) -> list[str]:
        """At job end, a last line without a newline is complete."""
        line = self._lines.take_partial()
        return [_text(line)] if line else []


def _text(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", errors="replace")
