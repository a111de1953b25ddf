"""What SkyPilot's ``POST /logs`` stream carries, pure: the job's own lines, told from what the server adds.

With ``tail=0`` the API server (SkyPilot 0.14) sends the job's ``run.log`` from its start (leaving out SkyPilot's
set-up lines before ``Waiting for task resources on``), then, with ``follow``, each line once the job has written
all of it (its ``\\n`` or ``\\r``); when the job is over, one trailer ``✓ Job finished (status: S).``. Opened on a
finished job it sends the whole log and the trailer, a last line without its newline glued to the trailer's front;
followed to the end it drops such a line. Between the job's lines the server puts its own: heartbeat and spinner
payloads (``<sky-payload>``), ``INFO: Waiting 1s for the logs to be written...`` while the job has no log yet,
an ``ERROR: Logs for job N ... does not exist`` when it gave up waiting, and a note when its streaming failed.

Whatever comes before the first ``Waiting for task resources on`` line is the server's too (its own logging while
it reaches the cluster): the job's log never starts earlier. Counting only the job's lines gives a position that
every read of the log agrees on: the server reads the file again from its start each time, so the K-th job line
of one read is the K-th of the next.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from npa_airflow.burst.client.log_text import strip_ansi, strip_control
from npa_airflow.common.log_lines import LineSplitter

# A line ends at \n, \r\n or a lone \r, as the server's reader splits the log; a \r at the end of a chunk waits
# for the next chunk, which may start with its \n.
_LINE_END = re.compile(r"\r\n|\n|\r(?=[\s\S])")
# SkyPilot's own first line of a job's log (sky.skylet.log_lib.LOG_FILE_START_STREAMING_AT).
START_MARKER = "Waiting for task resources on "
_TRAILER = re.compile(r"✓ Job finished \(status: (?P<status>[A-Za-z_]+)\)\.\s*$")
_SERVER_NOTES = re.compile(
    r"^(INFO: Waiting \d+s for the logs to be written\.\.\."
    r"|ERROR: Logs for (managed )?job \d+ \(status: [A-Za-z_]+\) does not exist"
    r"|(Managed j|J)ob \d+ not found \(see `sky queue`\)\."
    r"|Skip streaming logs as no job has been submitted\."
    r"|\[SkyPilot\] Log streaming stopped by an internal error"
    r"|'[\w.]+' request [0-9a-f-]+ cancelled$)"
)


class LineKind(enum.Enum):
    JOB = "job"  # a line of the job's log: counted
    NOTE = "note"  # a line the API server wrote about the stream: not counted
    CONTROL = "control"  # only payloads (heartbeat, spinner): neither counted nor shown
    END = "end"  # SkyPilot's trailer: the log is complete


@dataclass(frozen=True)
class StreamLine:
    """One line of the stream. For END, ``text`` is the job's last line glued to the trailer ("" when none)."""

    kind: LineKind
    text: str
    status: str | None = None


def classify_log_line(raw: str) -> StreamLine:
    """What one line of the ``/logs`` stream (without its line end) is."""
    text = strip_control(raw)
    if not text and raw:
        return StreamLine(LineKind.CONTROL, "")
    plain = strip_ansi(text)
    trailer = _TRAILER.search(plain)
    if trailer is not None:
        glued = _text_before_trailer(text)
        return StreamLine(LineKind.END, glued, trailer.group("status"))
    if _SERVER_NOTES.match(plain.strip()):
        return StreamLine(LineKind.NOTE, plain.strip())
    return StreamLine(LineKind.JOB, text)


def _text_before_trailer(text: str) -> str:
    """The job's own text in front of the trailer, with the trailer's colour codes removed."""
    before = text[: text.rfind("✓")]
    return re.sub(r"(\x1b\[[0-9;]*m)+$", "", before)


class LogStreamParser:
    """The lines of one ``/logs`` answer, classified, as its text arrives. With ``from_start`` (a ``tail=0`` read)
    lines before SkyPilot's first job-log line are the server's notes."""

    def __init__(self, from_start: bool = True) -> None:
        self._lines: LineSplitter[str] = LineSplitter(_LINE_END)
        self._started = not from_start

    def feed(self, text: str) -> list[StreamLine]:
        return [self._classify(raw) for raw in self._lines.feed(text)]

    def finish(self) -> list[StreamLine]:
        """At the end of the stream: the last line when it did end (a lone ``\\r``); a partial line is dropped."""
        partial = self._lines.take_partial()
        return [self._classify(partial[:-1])] if partial.endswith("\r") else []

    def _classify(self, raw: str) -> StreamLine:
        line = classify_log_line(raw)
        if not self._started and line.kind is LineKind.JOB:
            if START_MARKER not in line.text:
                return StreamLine(LineKind.NOTE, strip_ansi(line.text).strip())
            self._started = True
        return line
