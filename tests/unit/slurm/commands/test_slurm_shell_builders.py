"""String builders run through a real local bash (the same command line the hook sends over SSH)."""

from __future__ import annotations

import os
import subprocess

import pytest

from npa_airflow.exceptions import NpaParseError, NpaValidationError
from npa_airflow.slurm import commands as c


def run(command: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    # The hook hands the string to the remote login shell; sh -c plays that role here.
    return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, timeout=60, check=False)


def tail(requests, max_bytes):
    result = run(c.build_tail_logs(requests, max_bytes))
    assert result.returncode == 0, result.stderr
    return c.parse_tail_logs(result.stdout, requests)


# --------------------------------------------------------------------------------------------- tail


def test_tail_reads_new_bytes_and_reports_size(tmp_path):
    log = tmp_path / "main.out"
    log.write_bytes(b"line 1\nline 2\n")
    [chunk] = tail([(str(log), 0)], 1 << 20)
    assert (chunk.data, chunk.offset, chunk.size) == (b"line 1\nline 2\n", 14, 14)
    assert chunk.offset >= chunk.size
    with log.open("ab") as f:
        f.write(b"line 3\n")
    [chunk] = tail([(str(log), 14)], 1 << 20)
    assert (chunk.data, chunk.offset, chunk.size) == (b"line 3\n", 21, 21)
    [chunk] = tail([(str(log), 21)], 1 << 20)
    assert (chunk.data, chunk.offset, chunk.size) == (b"", 21, 21)


def test_tail_many_files_in_one_command_missing_and_shrunk(tmp_path):
    out, err, shrunk = tmp_path / "o", tmp_path / "dir with space" / "e'rr", tmp_path / "s"
    err.parent.mkdir()
    out.write_bytes(b"out")
    err.write_bytes(b"err!")
    shrunk.write_bytes(b"abc")
    missing = tmp_path / "not-yet"
    chunks = tail([(str(out), 0), (str(missing), 0), (str(err), 1), (str(shrunk), 10)], 100)
    assert [(ch.path, ch.data, ch.offset, ch.size) for ch in chunks] == [
        (str(out), b"out", 3, 3),
        (str(missing), b"", 0, -1),
        (str(err), b"rr!", 4, 4),
        (str(shrunk), b"", 10, 3),
    ]
    assert chunks[1].missing and not chunks[3].missing


def test_tail_is_binary_safe(tmp_path):
    data = bytes(range(256)) * 4 + b"\n\n\x00NPA-TAIL 0 5\nNPA-TAIL-END\n\xff"
    log = tmp_path / "bin"
    log.write_bytes(data)
    [chunk] = tail([(str(log), 0)], 1 << 20)
    assert chunk.data == data


def test_tail_reads_a_3mb_file_in_bounded_chunks(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    log = tmp_path / "big"
    log.write_bytes(data)
    offset, pieces = 0, []
    for _ in range(10):
        [chunk] = tail([(str(log), offset)], 1 << 20)
        assert len(chunk.data) <= 1 << 20
        assert chunk.size == len(data)
        pieces.append(chunk.data)
        offset = chunk.offset
        if chunk.offset >= chunk.size:
            break
    assert len(pieces) == 4
    assert b"".join(pieces) == data


def test_tail_path_with_shell_metacharacters_is_inert(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    evil = str(tmp_path / f"$(rm {victim})`rm {victim}`;rm {victim}")
    [chunk] = tail([(evil, 0)], 10)
    assert chunk.missing
    assert victim.read_text() == "keep"


@pytest.mark.parametrize(
    ("requests", "max_bytes"),
    [([], 10), ([("rel/path", 0)], 10), ([("/a\nb", 0)], 10), ([("/a", -1)], 10), ([("/a", 0)], 0)],
)
def test_build_tail_logs_validates(requests, max_bytes):
    with pytest.raises(NpaValidationError):
        c.build_tail_logs(requests, max_bytes)


def test_parse_tail_logs_detects_cut_output(tmp_path):
    log = tmp_path / "x"
    log.write_bytes(b"hello")
    requests = [(str(log), 0), (str(log), 2)]
    full = run(c.build_tail_logs(requests, 100)).stdout
    assert len(c.parse_tail_logs(full, requests)) == 2
    # Login banners before the frames are ignored.
    assert c.parse_tail_logs(b"Welcome!\n" + full, requests)[1].data == b"llo"
    for cut in (full[: full.index(b"NPA-TAIL 1")], full[: -len(b"NPA-TAIL-END\n")], b""):
        with pytest.raises(NpaParseError):
            c.parse_tail_logs(cut, requests)


# --------------------------------------------------------------------------------------------- batch


def test_a_batch_gives_each_command_its_own_status_and_output(tmp_path):
    marker = tmp_path / "touched"
    argvs = [
        ["printf", "%s\\n", "a b", f"$(touch {marker})"],  # argv: quoted, never run as shell
        "echo out; echo err >&2; exit 3",  # shell text: its exit ends only its own subshell
        ["sh", "-c", "printf '\\000\\377'"],  # binary-safe
        "true # a trailing comment does not swallow the frame",
        "cat",  # stdin is empty, not the batch's own
    ]
    result = run(c.build_batch(argvs), stdin=b"must not be read")
    assert result.returncode == 0, result.stderr
    assert c.parse_batch(result.stdout, len(argvs)) == [
        (0, f"a b\n$(touch {marker})\n".encode(), b""),
        (3, b"out\n", b"err\n"),
        (0, b"\x00\xff", b""),
        (0, b"", b""),
        (0, b"", b""),
    ]
    assert not marker.exists()


def test_a_cut_batch_is_a_parse_error_not_a_short_answer():
    result = run(c.build_batch([["echo", "1"], ["echo", "2"]]))
    whole = result.stdout
    cut = whole[: whole.index(b"NPA-BATCH 1 ")]
    with pytest.raises(NpaParseError, match="#1 of 2"):
        c.parse_batch(cut, 2)
    with pytest.raises(NpaParseError, match="end marker"):
        c.parse_batch(whole.replace(b"NPA-BATCH-END", b""), 2)
    with pytest.raises(NpaValidationError):
        c.build_batch([])
