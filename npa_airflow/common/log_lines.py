"""Complete lines out of a log read in chunks: Slurm's log files (bytes at offsets) and SkyPilot's log stream (text).

Each backend says where a line ends (``slurm.log_lines``: ``\\n``; ``burst.client.joblog``: ``\\n``, ``\\r\\n`` or a
lone ``\\r``) and what a partial last line is worth at the end of the log.
"""

from __future__ import annotations

import re
from typing import AnyStr, Generic


class LineSplitter(Generic[AnyStr]):
    """Turns the chunks of one log into its complete lines, without their line ends; a last line whose end has not
    arrived waits in `partial` for the next chunk. `committed` is the log's position just after the last line
    handed out (chunks that arrive with their end offset keep it on the file's own count)."""

    def __init__(self, line_end: re.Pattern[AnyStr], *, offset: int = 0, max_partial: int | None = None) -> None:
        self._line_end = line_end
        self._max_partial = max_partial  # a partial line longer than this is handed out without its end
        self.partial: AnyStr = line_end.pattern[:0]
        self.committed = offset

    def feed(self, data: AnyStr, end_offset: int | None = None) -> list[AnyStr]:
        """The lines `data` completes; `end_offset` is the log's position after `data` (default: counted here)."""
        buf = self.partial + data
        end = self.committed + len(buf) if end_offset is None else end_offset
        lines = []
        start = 0
        for match in self._line_end.finditer(buf):
            lines.append(buf[start : match.start()])
            start = match.end()
        rest = buf[start:]
        if self._max_partial is not None and len(rest) > self._max_partial:
            lines.append(rest)
            rest = rest[:0]
        self.partial = rest
        self.committed = end - len(rest)
        return lines

    def take_partial(self) -> AnyStr:
        """At the end of the log: the partial last line, now counted as handed out (empty when there is none)."""
        partial, self.partial = self.partial, self.partial[:0]
        self.committed += len(partial)
        return partial
