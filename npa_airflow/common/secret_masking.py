"""Secret values in the logs this package writes: registered with Airflow's secrets masker, redacted from text.

Airflow masks a value only in a process whose masker knows it. A task that defers is written to by three
processes: the worker (and its supervisor) before deferring, the triggerer (its trigger runner and the
supervisor that writes the trigger's log file) while the job runs, and a new worker for the completion. Each
registers the values itself, before it writes a line of the job's output.

A job prints a multi-line value line by line and the task log gets it line by line, so each line of a value is
registered as well as the whole value. Airflow leaves values shorter than ``[logging] min_length_masked_secret``
(default 5) unmasked: that rule is Airflow's, kept here so every log follows one policy.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow.sdk.log import amask_secret, mask_secret, redact


def mask_fragments(values: Iterable[str]) -> list[str]:
    """What to register for each value: the value, the value without its final newline, and each of its lines."""
    out: dict[str, None] = {}
    for value in values:
        if not isinstance(value, str) or not value:
            continue
        for fragment in (value, value.rstrip("\r\n"), *(line.rstrip("\r") for line in value.splitlines())):
            if fragment.strip():
                out[fragment] = None
    return list(out)


def mask_values(values: Iterable[str]) -> None:
    """Register `values` with this process's masker and, inside a task, with its supervisor's (which writes the log)."""
    for fragment in mask_fragments(values):
        mask_secret(fragment)


async def amask_values(values: Iterable[str]) -> None:
    """`mask_values` from a coroutine: in the triggerer the trigger runner tells its supervisor without blocking."""
    for fragment in mask_fragments(values):
        await amask_secret(fragment)


def redact_text(text: str) -> str:
    """`text` with every value this process's masker knows replaced by ``***``."""
    redacted = redact(text)
    return redacted if isinstance(redacted, str) else str(redacted)
