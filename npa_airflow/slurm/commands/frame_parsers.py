"""Parsers of the framed outputs: the log tail's (one frame a file) and the batched command's (one frame a
command), each frame's bytes base64 on one line. Each raises NpaParseError quoting the input it could not read;
a cut output (a connection lost mid-answer) is an error, never a shorter answer.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm.commands import records
from npa_airflow.slurm.commands.output_text import quote_output


def parse_tail_logs(stdout: bytes, requests: Sequence[tuple[str, int]]) -> list[records.LogChunk]:
    """Decode the frames printed by :func:`build_tail_logs`, one records.LogChunk per request, in order."""
    lines = stdout.split(b"\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(records.TAIL_MARK.encode() + b" "))
    except StopIteration:
        raise NpaParseError(f"log tail output has no frames: {quote_output(stdout)}") from None
    chunks: list[records.LogChunk] = []
    pos = start
    for index, (path, offset) in enumerate(requests):
        if pos + 1 >= len(lines):
            raise NpaParseError(
                f"log tail output ended after {index} of {len(requests)} files (connection cut?): "
                f"{quote_output(stdout)}"
            )
        header = lines[pos].decode("ascii", "replace").split()
        if len(header) != 3 or header[0] != records.TAIL_MARK or header[1] != str(index):
            raise NpaParseError(f"bad log tail frame header {quote_output(lines[pos])} for file #{index}")
        try:
            size = int(header[2])
            data = base64.b64decode(lines[pos + 1], validate=True)
        except (ValueError, binascii.Error) as exc:
            raise NpaParseError(f"bad log tail frame for {path!r}: {quote_output(lines[pos + 1])}") from exc
        chunks.append(records.LogChunk(path=path, data=data, offset=offset + len(data), size=size))
        pos += 2
    if pos >= len(lines) or lines[pos].strip() != records.TAIL_END.encode():
        raise NpaParseError(f"log tail output is missing its end marker: {quote_output(stdout)}")
    return chunks


def parse_batch(stdout: bytes, count: int) -> list[tuple[int, bytes, bytes]]:
    """(exit status, stdout, stderr) of each of the ``count`` commands of :func:`builders.build_batch`."""
    if records.BATCH_MARK.encode() + b" " not in stdout:
        raise NpaParseError(f"batched command output has no frames: {quote_output(stdout)}")
    results, ended = parse_batch_frames(stdout, count)
    if len(results) < count:
        raise NpaParseError(
            f"batched command output ended or broke at command #{len(results)} of {count}: {quote_output(stdout)}"
        )
    if not ended:
        raise NpaParseError(f"batched command output is missing its end marker: {quote_output(stdout)}")
    return results


def parse_batch_frames(stdout: bytes, count: int) -> tuple[list[tuple[int, bytes, bytes]], bool]:
    """The whole frames at the start of a batch's output, in order (fewer than ``count`` when it was cut: a batch
    of submissions tells what each command that finished answered), and whether the end marker followed."""
    lines = stdout.split(b"\n")
    mark = records.BATCH_MARK.encode() + b" "
    pos = next((i for i, line in enumerate(lines) if line.startswith(mark)), len(lines))
    results: list[tuple[int, bytes, bytes]] = []
    for index in range(count):
        header = lines[pos].decode("ascii", "replace").split() if pos < len(lines) else []
        if len(header) != 3 or header[0] != records.BATCH_MARK or header[1] != str(index) or pos + 3 >= len(lines):
            return results, False  # a frame is whole once the line after its stderr has begun
        try:
            results.append(
                (
                    int(header[2]),
                    base64.b64decode(lines[pos + 1], validate=True),
                    base64.b64decode(lines[pos + 2], validate=True),
                )
            )
        except (ValueError, binascii.Error) as exc:
            raise NpaParseError(f"bad frame for batched command #{index}: {quote_output(lines[pos])}") from exc
        pos += 3
    return results, pos < len(lines) and lines[pos].strip() == records.BATCH_END.encode()
