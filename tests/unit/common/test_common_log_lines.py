"""The one line splitter of both backends' logs (common/log_lines.py): bytes at offsets and streamed text."""

from __future__ import annotations

import re

from npa_airflow.common.log_lines import LineSplitter


def test_bytes_at_file_offsets_commit_only_complete_lines():
    split = LineSplitter(re.compile(rb"\n"), offset=10)
    assert split.feed(b"a\nbc", 14) == [b"a"]
    assert (split.partial, split.committed) == (b"bc", 12)
    assert split.feed(b"d\n\n", 17) == [b"bcd", b""]
    assert (split.partial, split.committed) == (b"", 17)
    split.feed(b"tail", 21)
    assert split.take_partial() == b"tail" and split.committed == 21
    assert split.take_partial() == b"" and split.committed == 21


def test_text_without_offsets_counts_its_own_position():
    split = LineSplitter(re.compile(r"\r\n|\n|\r(?=[\s\S])"))
    assert split.feed("ab") == []
    assert split.feed("c\nd\r") == ["abc"]
    assert split.partial == "d\r"  # a \r at the end of a chunk waits: its \n may come next
    assert split.feed("\ne\rf\n\ng") == ["d", "e", "f", ""]
    assert (split.partial, split.committed) == ("g", 12)


def test_a_partial_line_longer_than_the_limit_is_handed_out():
    split = LineSplitter(re.compile(rb"\n"), max_partial=4)
    assert split.feed(b"abcd") == []
    assert split.feed(b"e") == [b"abcde"]
    assert (split.partial, split.committed) == (b"", 5)
