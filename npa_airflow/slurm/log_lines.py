"""Byte chunks of a job's log file turned into the lines a trigger writes to the task log."""

from __future__ import annotations

MAX_PARTIAL_LINE = 64 * 1024  # a "line" longer than this is written out without waiting for its newline


class LineSplitter:
    """Turns byte chunks of one file into complete lines; keeps a partial last line for the next chunk."""

    def __init__(self, offset: int) -> None:
        self.pending = b""
        self.committed = offset  # end of the last line handed out

    def feed(self, data: bytes, end_offset: int) -> list[str]:
        buf = self.pending + data
        *lines, rest = buf.split(b"\n")
        if len(rest) > MAX_PARTIAL_LINE:
            lines.append(rest)
            rest = b""
        self.pending = rest
        self.committed = end_offset - len(rest)
        return [line.rstrip(b"\r").decode("utf-8", errors="replace") for line in lines]

    def flush(self) -> list[str]:
        """At job end, a last line without a newline is complete."""
        if not self.pending:
            return []
        line, self.pending = self.pending, b""
        self.committed += len(line)
        return [line.rstrip(b"\r").decode("utf-8", errors="replace")]
