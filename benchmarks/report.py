"""Plain-text (Markdown) tables and small statistics for the benchmark output."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]], note: str = "") -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [f"### {title}", ""]
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def p50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def pmax(values: Sequence[float]) -> float | None:
    return max(values) if values else None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def json_safe(value: object) -> object:
    """JSON-safe copy: dataclasses as dicts, keys as strings, anything else unknown as its str()."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
