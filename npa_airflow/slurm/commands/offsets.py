"""The small files a trigger keeps next to its job's stdout, on shared storage, and the shell that reads/writes them.

``<stdout>.npa-offsets`` holds the log offsets the task log already has (JSON {log path: byte offset}), so a
restarted triggerer resumes the log where it stopped. ``<stdout>.npa-owner-<task instance>`` holds the claim of
the trigger watching the job for that task instance (`npa_airflow.common.ownership`). Every fragment here is
silent and never fails: it rides along in the poller's tail command.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

from npa_airflow.common.ownership import Claim

OFFSETS_SUFFIX = ".npa-offsets"
CLAIM_SUFFIX = ".npa-owner-"


def offsets_file_for(stdout_path: str) -> str:
    """Where the committed log offsets of a job are kept (next to its stdout, on shared storage)."""
    return stdout_path + OFFSETS_SUFFIX


def claim_file_for(stdout_path: str, task_instance_key: str) -> str:
    """Where the trigger watching a job for one task instance records its claim (next to the offsets)."""
    return f"{stdout_path}{CLAIM_SUFFIX}{task_instance_key}"


def build_commit_offsets(
    entries: Sequence[tuple[str, str]], guards: Mapping[str, tuple[str, Claim]] | None = None
) -> str:
    """Shell fragment that atomically writes each (offsets file, JSON payload); silent, never fails.

    With `guards[offsets file] = (claim file, claim)`, that file is written only while the claim file still
    holds that claim: a trigger that another one has superseded never winds the offsets back.
    """
    parts = []
    for path, payload in entries:
        tmp = shlex.quote(path + ".tmp")
        write = (
            f"{{ printf '%s\\n' {shlex.quote(payload)} > {tmp} && mv -f {tmp} {shlex.quote(path)}; }} >/dev/null 2>&1"
        )
        guard = (guards or {}).get(path)
        if guard is not None:
            claim_file, claim = guard
            write = (
                f"l=; {{ read -r l < {shlex.quote(claim_file)}; }} 2>/dev/null; "
                f'if [ "$l" = {shlex.quote(claim.line())} ]; then {write}; fi'
            )
        parts.append(write)
    return "; ".join(parts)


def build_write_claims(entries: Sequence[tuple[str, Claim]]) -> str:
    """Shell fragment that atomically writes each (claim file, claim); silent, never fails."""
    parts = []
    for path, claim in entries:
        tmp = shlex.quote(f"{path}.{claim.token}.tmp")
        parts.append(
            f"{{ printf '%s\\n' {shlex.quote(claim.line())} > {tmp} && mv -f {tmp} {shlex.quote(path)}; }}"
            " >/dev/null 2>&1"
        )
    return "; ".join(parts)


def build_read_claims(paths: Sequence[str]) -> str:
    """Print the first line of each claim file (or nothing) followed by a NUL, then one newline.

    Shell builtins only: it runs in every tail command, for every tailed job.
    """
    reads = [f"l=; {{ read -r l < {shlex.quote(p)}; }} 2>/dev/null; printf '%s\\0' \"$l\"" for p in paths]
    return "; ".join([*reads, "printf '\\n'"])


def parse_read_claims(blob: bytes, paths: Sequence[str]) -> dict[str, Claim | None]:
    """Map each claim file to the claim it holds (None: missing, empty or damaged)."""
    parts = blob.split(b"\0")
    return {path: Claim.parse(parts[i]) if i < len(parts) else None for i, path in enumerate(paths)}


def build_read_offsets(paths: Sequence[str]) -> str:
    """Print each file's content (or nothing) followed by a NUL, in order."""
    return "; ".join(f"{{ cat {shlex.quote(p)} 2>/dev/null; printf '\\0'; }}" for p in paths)


def parse_read_offsets(stdout: bytes, paths: Sequence[str]) -> dict[str, dict[str, int]]:
    """Map each offsets file to its {log path: offset}; a missing or damaged file maps to {}."""
    blobs = stdout.split(b"\0")
    result: dict[str, dict[str, int]] = {}
    for i, path in enumerate(paths):
        raw = blobs[i].strip() if i < len(blobs) else b""
        try:
            data = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError):
            data = {}
        result[path] = (
            {str(k): int(v) for k, v in data.items() if isinstance(v, int) and v >= 0} if isinstance(data, dict) else {}
        )
    return result
