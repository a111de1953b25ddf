"""Parsers of what Slurm says about jobs: sbatch's job id, sacct, squeue and ``scontrol show job`` records (merged
into one answer per job), submit times and who cancelled a job.

Each raises NpaParseError quoting the input it could not read. The cluster's nodes and partitions are read in
:mod:`.cluster_parsers`, the framed outputs (log tails, batched commands) in :mod:`.frame_parsers`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm.commands import records
from npa_airflow.slurm.commands.output_text import data_lines, key_value, none_if, quote_output
from npa_airflow.slurm.commands.states import REQUEUE_CANDIDATE_STATES, interpret_native_state, normalize_native_state
from npa_airflow.slurm.commands.validation import CLUSTER_RE, JOB_ID_RE


def parse_sbatch_submit(stdout: str) -> records.SubmitResult:
    """The job id from ``sbatch --parsable`` output: the last non-empty line, ``id`` or ``id;cluster``.

    Site banners (MOTD-like lines from a submit filter) may come first and are ignored.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise NpaParseError(
            f"sbatch --parsable printed no job id (output {quote_output(stdout)}); the job may or may not "
            "exist: reconcile by job name before submitting again"
        )
    job_id, sep, cluster = lines[-1].partition(";")
    if not JOB_ID_RE.fullmatch(job_id) or (sep and not CLUSTER_RE.fullmatch(cluster)):
        raise NpaParseError(
            f"cannot read a job id from sbatch --parsable output {quote_output(stdout)}: expected a last "
            "line like '123' or '123;cluster'"
        )
    return records.SubmitResult(job_id=job_id, cluster=cluster if sep else None)


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct ExitCode ``'7:0'`` -> (7, 0); anything unreadable -> (None, None)."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def _aggregate(base: str, members: list[records.SlurmJobInfo]) -> records.SlurmJobInfo:
    """One answer for an array or het job asked for by its base id: the least finished member decides.

    Any member still queued/running -> that state (RUNNING before PENDING before UNKNOWN); all finished
    -> ERROR if any failed, else CANCELED if any was cancelled, else COMPLETE. No usage: each member is an
    allocation of its own (ask for the members).
    """
    order = (JobState.RUNNING, JobState.PENDING, JobState.UNKNOWN, JobState.ERROR, JobState.CANCELED)
    decider = next((m for state in order for m in members if m.state is state), members[-1])
    codes = [m.exit_code for m in members if m.exit_code is not None]
    nodes = [m.node_list for m in members if m.node_list]
    return records.SlurmJobInfo(
        job_id=base,
        native_state=decider.native_state,
        state=decider.state,
        exit_code=max(codes) if codes and decider.state.is_terminal else None,
        signal=decider.signal if decider.state.is_terminal else None,
        job_name=decider.job_name,
        node_list=",".join(dict.fromkeys(nodes)) or None,
        reason=decider.reason,
        source=decider.source,
    )


def _index(rows: list[tuple[str, records.SlurmJobInfo]]) -> dict[str, records.SlurmJobInfo]:
    """Key records by display id (last record wins), then add lookups by raw id and by base id.

    ``123_4`` (raw 130) also answers to ``130``; an array or het job asked for by its base id ``123``
    gets an aggregate of its members (see :func:`_aggregate`), unless a record has that display id.
    """
    by_id: dict[str, records.SlurmJobInfo] = {}
    raw_of: dict[str, str] = {}
    for raw_id, info in rows:
        by_id.pop(info.job_id, None)  # re-insert so dict order follows the last record
        by_id[info.job_id] = info
        raw_of[info.job_id] = raw_id
    groups: dict[str, list[records.SlurmJobInfo]] = {}
    for job_id, info in by_id.items():
        base = re.match(r"[0-9]+", job_id).group(0)  # type: ignore[union-attr]  # checked by the parsers
        if base != job_id:
            groups.setdefault(base, []).append(info)
    extra: dict[str, records.SlurmJobInfo] = {}
    for job_id, info in by_id.items():
        raw_id = raw_of[job_id]
        if raw_id and raw_id != job_id and raw_id not in groups and raw_id not in by_id:
            extra[raw_id] = info
    for base, members in groups.items():
        if base not in by_id:
            extra[base] = _aggregate(base, members)
    by_id.update(extra)
    return by_id


def parse_sacct(stdout: str, fields: Sequence[str] = records.SACCT_FIELDS) -> dict[str, records.SlurmJobInfo]:
    """Rows of ``sacct -X --parsable2 --noheader -o <fields>`` keyed by JobID.

    ``fields`` is :data:`records.SACCT_FIELDS` (state queries, with each job's usage; JobName last) or
    :data:`records.FIND_SACCT_FIELDS` (name lookups: submit time and comment after the name, the comment last).
    With ``--duplicates`` (or after a job-id reset) one id can have several records, e.g. REQUEUED then
    RUNNING: the last one wins (sacct prints them oldest first). Step rows (``123.batch``) are skipped.
    See :func:`_index` for the raw-id and base-id lookups of array and het jobs.
    """
    rows: list[tuple[str, records.SlurmJobInfo]] = []
    for line in data_lines(stdout):
        parts = _fields_of(line, len(fields))
        if parts is None:
            raise NpaParseError(
                f"sacct line {quote_output(line)} does not have the {len(fields)} fields {','.join(fields)}; "
                f"whole output {quote_output(stdout)}"
            )
        row = dict(zip(fields, parts, strict=True))
        job_id = row["JobID"]
        if "." in job_id:
            continue
        if not re.match(r"[0-9]+", job_id):
            raise NpaParseError(f"sacct line {quote_output(line)} has no job id; output {quote_output(stdout)}")
        native = normalize_native_state(row["State"])
        state = interpret_native_state(native)
        exit_code, signal = parse_exit_code(row["ExitCode"]) if state.is_terminal else (None, None)
        info = records.SlurmJobInfo(
            job_id=job_id,
            native_state=native,
            state=state,
            exit_code=exit_code,
            signal=signal,
            job_name=none_if(row["JobName"]),
            node_list=none_if(row["NodeList"], "None assigned", "(null)"),
            reason=none_if(row["Reason"], "None"),
            source="sacct",
            usage=_usage_of(row),
            **_owner_fields([row[k] for k in ("Submit", "Comment") if k in row]),
        )
        rows.append((row["JobIDRaw"], info))
    return _index(rows)


def parse_alloc_tres(text: str) -> tuple[int, int]:
    """(GPUs, nodes) of sacct's AllocTRES, e.g. ``billing=2,cpu=2,gres/gpu=16,mem=1000M,node=2`` -> (16, 2).

    Empty (a job not started yet) is (0, 0). A site that tracks GPU types has ``gres/gpu:h100=16``; when it
    tracks ``gres/gpu`` as well, that is the total (the typed counts repeat it), else the typed counts add up.
    Pairs that are not ``name=count`` are skipped.
    """
    counts: dict[str, int] = {}
    for pair in text.split(","):
        name, _, value = pair.strip().partition("=")
        if value.isdigit():
            counts[name] = int(value)
    typed = sum(n for name, n in counts.items() if name.startswith("gres/gpu:"))
    return counts.get("gres/gpu", typed), counts.get("node", 0)


def _usage_of(row: dict[str, str]) -> records.JobUsage | None:
    """The usage in a state query's row; None for a row without it (a name lookup) or an unreadable ElapsedRaw."""
    elapsed = row.get("ElapsedRaw", "")
    if "AllocTRES" not in row or not elapsed.isdigit():
        return None
    gpus, nodes = parse_alloc_tres(row["AllocTRES"])
    return records.JobUsage(gpus=gpus, nodes=nodes, elapsed_seconds=int(elapsed))


def parse_squeue(stdout: str, fields: Sequence[str] = records.SQUEUE_FIELDS) -> dict[str, records.SlurmJobInfo]:
    """Rows of ``squeue -h -o <fields joined by |>`` keyed by the displayed id (see :func:`_index`); ``fields`` as
    in :func:`parse_sacct` (:data:`records.SQUEUE_FIELDS` or :data:`records.FIND_SQUEUE_FIELDS`)."""
    rows: list[tuple[str, records.SlurmJobInfo]] = []
    for line in data_lines(stdout):
        parts = _fields_of(line, len(fields))
        if parts is None or not re.match(r"[0-9]+", parts[0]):
            raise NpaParseError(
                f"squeue line {quote_output(line)} is not '{'|'.join(fields)}'; whole output {quote_output(stdout)}"
            )
        job_id, raw_id, state_text, reason, nodes, name, *owner = parts
        native = normalize_native_state(state_text)
        info = records.SlurmJobInfo(
            job_id=job_id,
            native_state=native,
            state=interpret_native_state(native),
            exit_code=None,
            signal=None,
            job_name=none_if(name, "(null)"),  # "(null)": --only-job-state has no names
            node_list=none_if(nodes, "(null)"),
            reason=none_if(reason, "None"),
            source="squeue",
            **_owner_fields(owner),
        )
        rows.append((raw_id, info))
    return _index(rows)


def split_squeue_form(stdout: str) -> tuple[bool | None, str]:
    """(whether ``--only-job-state`` ran, squeue's own output) from :func:`builders.build_squeue_states_detecting`
    output; (None, stdout) when the first line is not its mark (the check did not run)."""
    first, _, rest = stdout.partition("\n")
    mark, _, form = first.partition(" ")
    if mark != records.SQUEUE_FORM_MARK:
        return None, stdout
    return form.strip() == "only-job-state", rest


def merge_pending_states(
    accounted: dict[str, records.SlurmJobInfo], live: dict[str, records.SlurmJobInfo], asked: Sequence[str]
) -> dict[str, records.SlurmJobInfo]:
    """sacct's answers, where squeue answered for the `asked` ids (jobs last seen pending), corrected by it.

    slurmctld's view wins for a job it shows queued or running: its pending Reason is true on every version
    (24.11's sacct prints Reason=None for every pending job) and it leads accounting. A job that ended keeps
    sacct's record (exit code, reason), and one squeue no longer shows keeps sacct's answer too. squeue says
    nothing of usage: a job both tools show in the same state keeps sacct's; one that changed state between the
    two has none (unknown).
    """
    merged = dict(accounted)
    for job_id in asked:
        now, before = live.get(job_id), accounted.get(job_id)
        if now is not None and (before is None or now.state in (JobState.PENDING, JobState.RUNNING)):
            merged[job_id] = replace(now, usage=before.usage) if before and before.state is now.state else now
    return merged


def _fields_of(line: str, count: int) -> list[str] | None:
    """The ``count`` |-separated fields of ``line`` (the last keeps any further |), stripped; None if fewer."""
    parts = line.split("|", count - 1)
    return [p.strip() for p in parts] if len(parts) == count else None


def _owner_fields(owner: Sequence[str]) -> dict[str, object]:
    """The submit time and comment that follow the state fields in a name lookup (nothing in a state query)."""
    if not owner:
        return {}
    submitted, comment = owner
    return {
        "submitted_at": float(submitted) if re.fullmatch(r"[0-9]{1,12}", submitted) else None,
        "comment": none_if(comment, "(null)"),
    }


def may_run_again(info: records.SlurmJobInfo) -> bool:
    """Accounting says the job ended in a state Slurm requeues from: only squeue can tell whether it did."""
    return info.source == "sacct" and info.native_state in REQUEUE_CANDIDATE_STATES


def merge_live_states(
    accounted: dict[str, records.SlurmJobInfo],
    live: dict[str, records.SlurmJobInfo] | None,
    asked: Sequence[str],
) -> dict[str, records.SlurmJobInfo]:
    """sacct's answers completed by squeue's for the `asked` ids (those sacct lacks or that may run again).

    A job squeue shows queued or running again (a requeue) takes squeue's answer. With no squeue answer
    (`live` None: slurmctld did not answer), a job that may run again is left out (unknown) rather than ended.
    """
    merged = dict(accounted)
    for job_id in asked:
        now = (live or {}).get(job_id)
        if job_id not in accounted:
            if now is not None:
                merged[job_id] = now
        elif live is None:
            del merged[job_id]
        elif now is not None and now.state in (JobState.PENDING, JobState.RUNNING):
            merged[job_id] = now
    return merged


def parse_submit_time(stdout: str, job_id: str) -> float | None:
    """The submit time (epoch seconds) of ``job_id`` in :func:`builders.build_submit_time` output, else None."""
    times = [
        int(m.group(2))
        for m in re.finditer(r"^([^|\s]+)\|([0-9]{1,12})\s*$", stdout, re.MULTILINE)
        if m.group(1) == job_id
    ]
    return float(min(times)) if times else None


def parse_cancel_origin(stdout: str, *, accounting: bool = True) -> records.CancelOrigin:
    """Read :func:`builders.build_cancel_origin` output (built with the same ``accounting``)."""
    lines = stdout.split("\n")
    state = next((x[len(records.CANCEL_STATE) + 1 :].strip() for x in lines if x.startswith(records.CANCEL_STATE)), "")
    user_line = next((x.split(" ", 2)[1:] for x in lines if x.startswith(records.CANCEL_USER + " ")), [])
    uid = user_line[0] if user_line and user_line[0].isdigit() else None
    user = user_line[1].strip() if len(user_line) > 1 and user_line[1].strip() else None
    by_airflow = records.CANCEL_BY_AIRFLOW in lines
    if not accounting:
        return records.CancelOrigin(by_airflow=by_airflow, state=state, accounting=False)
    mark = records.CANCEL_SACCT_ERROR + " "
    error = next((x[len(mark) :].strip() for x in lines if x.startswith(mark)), None)
    return records.CancelOrigin(by_airflow=by_airflow, state=state, uid=uid, user=user, sacct_error=error or None)


def parse_scontrol_job(stdout: str) -> records.SlurmJobInfo | None:
    """``scontrol --oneliner show job`` of one job (its first record); None when it printed none."""
    line = next(data_lines(stdout), None)
    if line is None:
        return None
    job_id, state_text = key_value(line, "JobId"), key_value(line, "JobState")
    if not job_id or not re.fullmatch(r"[0-9]+", job_id) or state_text is None:
        raise NpaParseError(f"scontrol job line without JobId/JobState: {quote_output(line)}")
    native = normalize_native_state(state_text)
    state = interpret_native_state(native)
    exit_code, signal = parse_exit_code(key_value(line, "ExitCode") or "") if state.is_terminal else (None, None)
    name = re.search(r"(?:^|\s)JobName=(.*?)(?=\s+[A-Za-z/:]+=|$)", line)
    return records.SlurmJobInfo(
        job_id=job_id,
        native_state=native,
        state=state,
        exit_code=exit_code,
        signal=signal,
        job_name=none_if(name.group(1)) if name else None,
        node_list=none_if(key_value(line, "NodeList") or "", "(null)"),
        reason=none_if(key_value(line, "Reason") or "", "None"),
        source="scontrol",
    )
