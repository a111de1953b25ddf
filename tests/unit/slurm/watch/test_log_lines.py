"""A Slurm job's log file read in byte chunks at offsets (slurm/watch/log_lines.py)."""

from __future__ import annotations

from npa_airflow.slurm.watch.log_lines import MAX_PARTIAL_LINE, LogFileLines


def test_partial_lines_wait_and_bad_utf8_is_replaced():
    s = LogFileLines(offset=100)
    assert s.feed(b"one\ntw", 106) == ["one"]
    assert s.committed == 104  # the partial "tw" is not committed
    assert s.feed(b"o\r\n\xff\xfebad\n", 115) == ["two", "\ufffd\ufffdbad"]
    assert s.committed == 115
    assert s.feed(b"tail-no-newline", 130) == []
    assert s.flush() == ["tail-no-newline"] and s.committed == 130
    assert s.flush() == [] and s.committed == 130


def test_a_lone_cr_stays_in_its_line_and_an_overlong_line_is_written_without_its_newline():
    s = LogFileLines(offset=0)
    assert s.feed(b"50%\r100%\r\r\n", 11) == ["50%\r100%"]
    long = b"x" * (MAX_PARTIAL_LINE + 1)
    assert s.feed(long, 11 + len(long)) == [long.decode()]
    assert s.committed == 11 + len(long)
