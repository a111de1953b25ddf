"""A job's own end record, seen before accounting has it.

The rendered batch script writes `<results dir>/child_exit_code` as its last act and removes an earlier run's
copy when it starts (templates/slurm). Under load slurmdbd falls behind: at N = 1,000 jobs ending in waves,
sacct still reported 284 of them RUNNING at a poll after their end (docs/benchmarks.md). So the poller's state
query also looks, in the same command as its sacct, for the end record of each job it has not seen end; the
jobs that have one while sacct says RUNNING (or PENDING: slurmdbd stalled before it recorded the start) join the
query's one squeue, and slurmctld, which knows the end at once, settles them. While no job ends, nothing more is
asked: the steady state costs slurmctld no RPC.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from npa_airflow.common.retry import Backoff
from npa_airflow.common.states import JobState

if TYPE_CHECKING:
    from npa_airflow.slurm.commands.records import SlurmJobInfo

# A job whose end record slurmctld did not confirm (the script was between its last write and its exit, which
# takes seconds on a loaded node, or the file is not the script's) is asked about again after a wait that
# doubles from 1 s to at most 120 s (`END_ASK_BACKOFF.plain(asks)`): a handful of squeues per such job, and its
# end is still seen while accounting stalls for hours.
END_ASK_BACKOFF = Backoff(base=1.0, cap=120.0, jitter=0.0)
NO_EXIT_CODE = "?"  # with_end_record_codes: the record exists but holds no exit code


def with_end_records(argv: Sequence[str], paths: Sequence[str]) -> str:
    """`argv` (a state query) preceded by ONE line: a character per path, 1 (it exists) or 0. Shell builtins
    only; the command's exit status and the rest of its output are argv's own."""
    tests = [f"if [ -e {shlex.quote(p)} ]; then printf 1; else printf 0; fi" for p in paths]
    return "; ".join([*tests, "printf '\\n'", f"exec {shlex.join(argv)}"])


def split_end_records(stdout: str, paths: Sequence[str]) -> tuple[dict[str, bool], str]:
    """(whether each path existed, the state query's own output) from :func:`with_end_records` output. A short
    or damaged line says False for the paths it lacks."""
    line, _, rest = stdout.partition("\n")
    return {path: line[i : i + 1] == "1" for i, path in enumerate(paths)}, rest


def with_end_record_codes(argv: Sequence[str], paths: Sequence[str]) -> str:
    """`argv` (a state query) preceded by ONE line: per path, the exit code its end record holds, ``-`` when there
    is none, ``?`` when it holds no exit code. Shell builtins only; the rest is argv's own output and status."""
    reads = []
    for path in paths:
        q = shlex.quote(path)
        reads.append(
            f"if [ -e {q} ]; then c=; {{ IFS= read -r c < {q}; }} 2>/dev/null || :; "
            f"case $c in [0-9]|[0-9][0-9]|[0-9][0-9][0-9]) printf '%s ' \"$c\" ;; *) printf '{NO_EXIT_CODE} ' ;; esac; "
            "else printf -- '- '; fi"
        )
    return "; ".join([*reads, "printf '\\n'", f"exec {shlex.join(argv)}"])


def split_end_record_codes(stdout: str, paths: Sequence[str]) -> tuple[dict[str, int | None], str]:
    """({path: exit code, or None for a record without one} for the paths that have a record, the state query's
    own output) from :func:`with_end_record_codes` output. A short or damaged line has no record for the rest."""
    line, _, rest = stdout.partition("\n")
    tokens = line.split()
    codes: dict[str, int | None] = {}
    for path, word in zip(paths, tokens, strict=False):
        if word.isdigit():
            codes[path] = int(word)
        elif word == NO_EXIT_CODE:
            codes[path] = None
    return codes, rest


def ended_before_accounting(
    accounted: Mapping[str, SlurmJobInfo], live: Mapping[str, SlurmJobInfo], candidates: Sequence[str]
) -> dict[str, SlurmJobInfo]:
    """squeue's answer for the candidates (end record found, sacct has no end) that it shows COMPLETED.

    Only COMPLETED is taken early: it is final (never requeued) and means exit code 0. A failed job's exit code
    and reason come from sacct, so any other end waits for accounting. squeue says nothing of usage: the job keeps
    that of sacct's RUNNING record, its elapsed time counted to that sacct (the end, give or take the round trip,
    unless accounting stalled before it); after a PENDING record (the start never recorded) it is unknown.
    """
    early = {}
    for job_id in candidates:
        now, before = live.get(job_id), accounted.get(job_id)
        if now is not None and now.state is JobState.COMPLETE and (before is None or not before.state.is_terminal):
            if before is not None and before.state is JobState.RUNNING:
                now = replace(now, usage=before.usage)
            early[job_id] = now
    return early
