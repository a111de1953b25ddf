"""The text of SkyPilot's logs and error messages, cleaned: ANSI codes, its spinner, heartbeat and payload
control codes, the tree glyphs of its job logs, and the lines only an interactive terminal needs."""

from __future__ import annotations

import re

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CONTROL_RE = re.compile(
    r"<(rich_init|rich_start|rich_stop|rich_exit|rich_update|heartbeat|retry)>.*?</\1>"
    r"|<sky-payload[^>]*>.*?</sky-payload>",
    re.S,
)
_TREE_RE = re.compile(r"^\s*[├└│]──\s*")
_TERMINAL_ONLY = ("(Ctrl-C to exit log streaming", "Waiting for 'sky.", "[?25h", "[?25l")


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


def strip_control(text: str) -> str:
    """``text`` without SkyPilot's spinner, heartbeat and payload control codes."""
    return _CONTROL_RE.sub("", text)


def clean_log_line(line: str) -> str | None:
    """A job log line without ANSI codes, SkyPilot's spinner/payload control codes and its tree glyphs;
    None for lines that only address an interactive terminal."""
    text = _CONTROL_RE.sub("", strip_ansi(line)).replace("\r", "").rstrip("\n")
    if any(marker in text for marker in _TERMINAL_ONLY):
        return None
    text = _TREE_RE.sub("", text)
    return text if text.strip() else None
