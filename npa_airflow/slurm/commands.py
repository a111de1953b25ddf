"""Pure command builders and output parsers for sbatch, sacct, squeue, scancel, scontrol and log tails.

No I/O here: the hook runs what these build. Builders return an argv list (the hook joins it with
``shlex.join``) or a string assembled only from ``shlex.quote``d parts. Every job id, cluster and job
name is validated against a strict pattern before it reaches a builder; paths are absolute and free of
NUL and newlines. Parsers take recorded tool output and raise NpaParseError quoting the input.

String builders wrap their script in ``bash -c '<script>'`` so the login user's shell (tcsh, zsh, ...)
does not matter.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from npa_airflow.common.naming import validate_job_name
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaParseError, NpaValidationError
from npa_airflow.slurm.handle import JOB_ID_RE
from npa_airflow.slurm.states import interpret_native_state, normalize_native_state

# ---------------------------------------------------------------------------------------------------------
# Types


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    cluster: str | None


@dataclass(frozen=True)
class SlurmJobInfo:
    job_id: str  # as Slurm displays it: "123", "123_4" (array task), "123+0" (het component)
    native_state: str  # normalised first word: "CANCELLED by 0" -> "CANCELLED"
    state: JobState
    exit_code: int | None  # None until the job is terminal (and always from squeue)
    signal: int | None
    job_name: str | None
    node_list: str | None
    reason: str | None
    source: str  # "sacct" | "squeue"


@dataclass(frozen=True)
class LogChunk:
    path: str
    data: bytes
    offset: int  # the new offset: request offset + len(data)
    size: int  # file size when read; -1 = the file does not exist (yet)

    @property
    def missing(self) -> bool:
        return self.size < 0

    @property
    def shrank(self) -> bool:
        """The file is now shorter than the offset asked for (truncated or replaced): nothing was read."""
        return 0 <= self.size < self.offset

    @property
    def at_end(self) -> bool:
        return self.size >= 0 and self.offset >= self.size


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # as scontrol prints it, e.g. "IDLE", "MIXED", "DOWN*", "IDLE+DRAIN"
    partitions: tuple[str, ...]
    reason: str | None

    @property
    def base_state(self) -> str:
        return re.split(r"[+*~#!%$@^-]", self.state, maxsplit=1)[0].upper()

    @property
    def usable(self) -> bool:
        """Up and not draining: a job could be placed on it."""
        flags = self.state.upper()
        return self.base_state not in {"DOWN", "FUTURE", "UNKNOWN"} and "DRAIN" not in flags and "*" not in flags


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    max_time_minutes: int | None  # None = UNLIMITED
    default: bool
    state: str
    nodes: str | None


# ---------------------------------------------------------------------------------------------------------
# Validation

# 123, 123_4 (array task), 123+0 (het job component). Pending array ranges like 123_[1-5] are only ever
# parsed from output, never sent.
CLUSTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_OUTPUT_QUOTE_MAX = 400


def _quote_output(text: str | bytes) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) > _OUTPUT_QUOTE_MAX:
        text = text[:_OUTPUT_QUOTE_MAX] + f"... ({len(text)} characters)"
    return repr(text)


def validate_job_id(job_id: object, field: str = "job_id") -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise NpaValidationError(
            f"{field}={job_id!r} is not a Slurm job id: expected digits, optionally with an array task "
            "('123_4') or a het component ('123+0')"
        )
    return job_id


def validate_cluster(cluster: object, field: str = "cluster") -> str:
    if not isinstance(cluster, str) or not CLUSTER_RE.fullmatch(cluster):
        raise NpaValidationError(f"{field}={cluster!r} is not a valid Slurm cluster name ([A-Za-z0-9_.-])")
    return cluster


def validate_remote_path(path: object, field: str = "path") -> str:
    """An absolute path with no NUL or newline (it is always quoted on the way out)."""
    if not isinstance(path, str) or not path:
        raise NpaValidationError(f"{field}={path!r} must be a non-empty absolute path")
    if "\x00" in path or "\n" in path or "\r" in path:
        raise NpaValidationError(f"{field}={path!r} contains a NUL or newline character; choose another path")
    if not path.startswith("/"):
        raise NpaValidationError(f"{field}={path!r} must be absolute (start with '/') on the cluster")
    return path


def _job_id_list(job_ids: Iterable[str]) -> str:
    ids = [validate_job_id(j) for j in job_ids]
    if not ids:
        raise NpaValidationError("job_ids is empty: give at least one Slurm job id")
    return ",".join(dict.fromkeys(ids))


def _name_list(names: Iterable[str]) -> str:
    checked = [validate_job_name(n, "names") for n in names]
    if not checked:
        raise NpaValidationError("names is empty: give at least one job name")
    return ",".join(dict.fromkeys(checked))


def _cluster_args(cluster: str | None) -> list[str]:
    return [] if cluster is None else ["-M", validate_cluster(cluster)]


def _bash(script: str) -> str:
    return "bash -c " + shlex.quote(script)


# ---------------------------------------------------------------------------------------------------------
# sbatch


def build_sbatch_submit(script_path: str, sbatch_args: Sequence[str] = (), cluster: str | None = None) -> list[str]:
    """``sbatch --parsable [args] <script>``; extra args must be single ``--option[=value]`` words."""
    for arg in sbatch_args:
        if not isinstance(arg, str) or not arg.startswith("--") or any(c in arg for c in "\x00\n\r"):
            raise NpaValidationError(f"sbatch argument {arg!r} must be one '--option[=value]' without newlines")
    return ["sbatch", "--parsable", *_cluster_args(cluster), *sbatch_args, validate_remote_path(script_path)]


def parse_sbatch_submit(stdout: str) -> SubmitResult:
    """The job id from ``sbatch --parsable`` output: the last non-empty line, ``id`` or ``id;cluster``.

    Site banners (MOTD-like lines from a submit filter) may come first and are ignored.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise NpaParseError(
            f"sbatch --parsable printed no job id (output {_quote_output(stdout)}); the job may or may not "
            "exist: reconcile by job name before submitting again"
        )
    job_id, sep, cluster = lines[-1].partition(";")
    if not JOB_ID_RE.fullmatch(job_id) or (sep and not CLUSTER_RE.fullmatch(cluster)):
        raise NpaParseError(
            f"cannot read a job id from sbatch --parsable output {_quote_output(stdout)}: expected a last "
            "line like '123' or '123;cluster'"
        )
    return SubmitResult(job_id=job_id, cluster=cluster if sep else None)


# ---------------------------------------------------------------------------------------------------------
# sacct / squeue

# JobName goes last and the parser splits at most len-1 times, so a '|' in a foreign job name cannot
# shift columns. Reason values are scheduler tokens (no '|').
SACCT_FIELDS = ("JobIDRaw", "JobID", "State", "ExitCode", "NodeList", "Reason", "JobName")
# squeue: %i display id (123_4, 123+0), %A raw id, %T extended state, %r reason, %N nodes, %j name.
SQUEUE_FIELDS = ("%i", "%A", "%T", "%r", "%N", "%j")
SQUEUE_FORMAT = "|".join(SQUEUE_FIELDS)
# Without -j, sacct's window starts at midnight today: name searches give an explicit start.
DEFAULT_NAME_SEARCH_START = "now-7days"


def _sacct_base(cluster: str | None) -> list[str]:
    return ["sacct", "-X", "--parsable2", "--noheader", *_cluster_args(cluster), "-o", ",".join(SACCT_FIELDS)]


def build_sacct_states(job_ids: Iterable[str], cluster: str | None = None) -> list[str]:
    """ONE sacct for many jobs. With -j, sacct's default window starts at the epoch (not midnight)."""
    return [*_sacct_base(cluster), "-j", _job_id_list(job_ids)]


def build_squeue_states(job_ids: Iterable[str], cluster: str | None = None) -> list[str]:
    """ONE squeue for many jobs, all states (finished jobs stay visible for MinJobAge)."""
    return [
        "squeue",
        "-h",
        "-t",
        "all",
        *_cluster_args(cluster),
        f"--jobs={_job_id_list(job_ids)}",
        "-o",
        SQUEUE_FORMAT,
    ]


def build_find_by_name_sacct(
    names: Iterable[str], cluster: str | None = None, start: str = DEFAULT_NAME_SEARCH_START
) -> list[str]:
    """Accounting records with any of these exact names, since ``start`` (sacct time syntax)."""
    if not re.fullmatch(r"[A-Za-z0-9:+-]{1,32}", start):
        raise NpaValidationError(f"start={start!r} is not a sacct time (e.g. 'now-7days', '2026-01-01T00:00')")
    return [*_sacct_base(cluster), "-S", start, f"--name={_name_list(names)}"]


def build_find_by_name_squeue(names: Iterable[str], cluster: str | None = None) -> list[str]:
    return [
        "squeue",
        "-h",
        "-t",
        "all",
        *_cluster_args(cluster),
        f"--name={_name_list(names)}",
        "-o",
        SQUEUE_FORMAT,
    ]


def _none_if(value: str, *empty: str) -> str | None:
    value = value.strip()
    return None if not value or value in empty else value


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct ExitCode ``'7:0'`` -> (7, 0); anything unreadable -> (None, None)."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def _is_cluster_banner(line: str) -> bool:
    # With -M, squeue (and some sacct builds) print "CLUSTER: name" before the rows.
    return line.startswith("CLUSTER: ")


def _aggregate(base: str, members: list[SlurmJobInfo]) -> SlurmJobInfo:
    """One answer for an array or het job asked for by its base id: the least finished member decides.

    Any member still queued/running -> that state (RUNNING before PENDING before UNKNOWN); all finished
    -> ERROR if any failed, else CANCELED if any was cancelled, else COMPLETE.
    """
    order = (JobState.RUNNING, JobState.PENDING, JobState.UNKNOWN, JobState.ERROR, JobState.CANCELED)
    decider = next((m for state in order for m in members if m.state is state), members[-1])
    codes = [m.exit_code for m in members if m.exit_code is not None]
    nodes = [m.node_list for m in members if m.node_list]
    return SlurmJobInfo(
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


def _index(records: list[tuple[str, SlurmJobInfo]]) -> dict[str, SlurmJobInfo]:
    """Key records by display id (last record wins), then add lookups by raw id and by base id.

    ``123_4`` (raw 130) also answers to ``130``; an array or het job asked for by its base id ``123``
    gets an aggregate of its members (see :func:`_aggregate`), unless a record has that display id.
    """
    by_id: dict[str, SlurmJobInfo] = {}
    raw_of: dict[str, str] = {}
    for raw_id, info in records:
        by_id.pop(info.job_id, None)  # re-insert so dict order follows the last record
        by_id[info.job_id] = info
        raw_of[info.job_id] = raw_id
    groups: dict[str, list[SlurmJobInfo]] = {}
    for job_id, info in by_id.items():
        base = re.match(r"[0-9]+", job_id).group(0)  # type: ignore[union-attr]  # checked by the parsers
        if base != job_id:
            groups.setdefault(base, []).append(info)
    extra: dict[str, SlurmJobInfo] = {}
    for job_id, info in by_id.items():
        raw_id = raw_of[job_id]
        if raw_id and raw_id != job_id and raw_id not in groups and raw_id not in by_id:
            extra[raw_id] = info
    for base, members in groups.items():
        if base not in by_id:
            extra[base] = _aggregate(base, members)
    by_id.update(extra)
    return by_id


def parse_sacct(stdout: str) -> dict[str, SlurmJobInfo]:
    """Rows of ``sacct -X --parsable2 --noheader -o <SACCT_FIELDS>`` keyed by JobID.

    With ``--duplicates`` (or after a job-id reset) one id can have several records, e.g. REQUEUED then
    RUNNING: the last one wins (sacct prints them oldest first). Step rows (``123.batch``) are skipped.
    See :func:`_index` for the raw-id and base-id lookups of array and het jobs.
    """
    records: list[tuple[str, SlurmJobInfo]] = []
    nfields = len(SACCT_FIELDS)
    for line in stdout.splitlines():
        if not line.strip() or _is_cluster_banner(line):
            continue
        parts = line.split("|", nfields - 1)
        if len(parts) != nfields:
            raise NpaParseError(
                f"sacct line {_quote_output(line)} has {len(parts)} fields, expected {nfields} "
                f"({','.join(SACCT_FIELDS)}); whole output {_quote_output(stdout)}"
            )
        raw_id, job_id, state_text, exit_text, nodes, reason, name = (p.strip() for p in parts)
        if "." in job_id:
            continue
        if not re.match(r"[0-9]+", job_id):
            raise NpaParseError(f"sacct line {_quote_output(line)} has no job id; output {_quote_output(stdout)}")
        native = normalize_native_state(state_text)
        state = interpret_native_state(native)
        exit_code, signal = parse_exit_code(exit_text) if state.is_terminal else (None, None)
        info = SlurmJobInfo(
            job_id=job_id,
            native_state=native,
            state=state,
            exit_code=exit_code,
            signal=signal,
            job_name=_none_if(name),
            node_list=_none_if(nodes, "None assigned", "(null)"),
            reason=_none_if(reason, "None"),
            source="sacct",
        )
        records.append((raw_id, info))
    return _index(records)


def parse_squeue(stdout: str) -> dict[str, SlurmJobInfo]:
    """Rows of ``squeue -h -o <SQUEUE_FORMAT>`` keyed by the displayed id (see :func:`_index`)."""
    records: list[tuple[str, SlurmJobInfo]] = []
    nfields = len(SQUEUE_FIELDS)
    for line in stdout.splitlines():
        if not line.strip() or _is_cluster_banner(line):
            continue
        parts = line.split("|", nfields - 1)
        if len(parts) != nfields or not re.match(r"[0-9]+", parts[0].strip()):
            raise NpaParseError(
                f"squeue line {_quote_output(line)} is not '{SQUEUE_FORMAT}'; whole output {_quote_output(stdout)}"
            )
        job_id, raw_id, state_text, reason, nodes, name = (p.strip() for p in parts)
        native = normalize_native_state(state_text)
        info = SlurmJobInfo(
            job_id=job_id,
            native_state=native,
            state=interpret_native_state(native),
            exit_code=None,
            signal=None,
            job_name=_none_if(name),
            node_list=_none_if(nodes, "(null)"),
            reason=_none_if(reason, "None"),
            source="squeue",
        )
        records.append((raw_id, info))
    return _index(records)


def is_invalid_job_id_error(stderr: str) -> bool:
    """squeue's answer when the ONLY id asked for is unknown to slurmctld (purged after MinJobAge): rc 1.

    With several ids squeue silently omits the unknown ones and exits 0 (Slurm 22.05).
    """
    return "Invalid job id specified" in stderr


# ---------------------------------------------------------------------------------------------------------
# scancel


def build_cancel(job_id: str, cluster: str | None = None) -> list[str]:
    return ["scancel", *_cluster_args(cluster), validate_job_id(job_id)]


def cancel_means_finished(stderr: str) -> bool:
    """scancel refused because the job already ended or was purged: for us that is a successful cancel."""
    text = stderr.lower()
    return (
        "already completing or completed" in text
        or "invalid job id specified" in text
        or "job/step already completing" in text
    )


# ---------------------------------------------------------------------------------------------------------
# Log tails

TAIL_MARK = "NPA-TAIL"
TAIL_END = "NPA-TAIL-END"
# Per request: a header "NPA-TAIL <index> <size>" then one line of base64 (possibly empty). Base64 keeps
# the frame intact for binary data and for a file that shrinks between stat and read.
_TAIL_FUNCTION = (
    "t() { "
    's=-1; if [ -f "$2" ]; then s=$(stat -L -c %s -- "$2" 2>/dev/null) || s=-1; fi; '
    f'printf "{TAIL_MARK} %s %s\\n" "$1" "$s"; '
    'if [ "$s" -gt "$3" ]; then n=$((s - $3)); if [ "$n" -gt "$4" ]; then n=$4; fi; '
    'tail -c +"$(($3 + 1))" -- "$2" | head -c "$n" | base64 -w0; fi; '
    "printf '\\n'; }"
)


def build_tail_logs(requests: Sequence[tuple[str, int]], max_bytes: int) -> str:
    """ONE remote command that reads up to ``max_bytes`` of each ``(path, offset)`` and its current size."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
        raise NpaValidationError(f"max_bytes={max_bytes!r} must be a positive integer")
    if not requests:
        raise NpaValidationError("requests is empty: give at least one (path, offset)")
    calls = []
    for index, (path, offset) in enumerate(requests):
        validate_remote_path(path, "log path")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise NpaValidationError(f"offset={offset!r} for {path!r} must be an integer >= 0")
        calls.append(f"t {index} {shlex.quote(path)} {offset} {max_bytes}")
    script = "; ".join([_TAIL_FUNCTION, *calls, f"echo {TAIL_END}"])
    return _bash(script)


def parse_tail_logs(stdout: bytes, requests: Sequence[tuple[str, int]]) -> list[LogChunk]:
    """Decode the frames printed by :func:`build_tail_logs`, one LogChunk per request, in order."""
    lines = stdout.split(b"\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(TAIL_MARK.encode() + b" "))
    except StopIteration:
        raise NpaParseError(f"log tail output has no frames: {_quote_output(stdout)}") from None
    chunks: list[LogChunk] = []
    pos = start
    for index, (path, offset) in enumerate(requests):
        if pos + 1 >= len(lines):
            raise NpaParseError(
                f"log tail output ended after {index} of {len(requests)} files (connection cut?): "
                f"{_quote_output(stdout)}"
            )
        header = lines[pos].decode("ascii", "replace").split()
        if len(header) != 3 or header[0] != TAIL_MARK or header[1] != str(index):
            raise NpaParseError(f"bad log tail frame header {_quote_output(lines[pos])} for file #{index}")
        try:
            size = int(header[2])
            data = base64.b64decode(lines[pos + 1], validate=True)
        except (ValueError, binascii.Error) as exc:
            raise NpaParseError(f"bad log tail frame for {path!r}: {_quote_output(lines[pos + 1])}") from exc
        chunks.append(LogChunk(path=path, data=data, offset=offset + len(data), size=size))
        pos += 2
    if pos >= len(lines) or lines[pos].strip() != TAIL_END.encode():
        raise NpaParseError(f"log tail output is missing its end marker: {_quote_output(stdout)}")
    return chunks


# ---------------------------------------------------------------------------------------------------------
# scontrol: nodes and partitions


def build_scontrol_nodes(cluster: str | None = None) -> list[str]:
    return ["scontrol", *_cluster_args(cluster), "--oneliner", "show", "nodes"]


def build_partitions(cluster: str | None = None) -> list[str]:
    return ["scontrol", *_cluster_args(cluster), "--oneliner", "show", "partitions"]


def _field(line: str, key: str) -> str | None:
    m = re.search(rf"(?:^|\s){key}=(\S*)", line)
    return m.group(1) if m else None


def parse_scontrol_nodes(stdout: str) -> dict[str, NodeInfo]:
    nodes: dict[str, NodeInfo] = {}
    for line in stdout.splitlines():
        if not line.strip() or _is_cluster_banner(line):
            continue
        name = _field(line, "NodeName")
        state = _field(line, "State")
        if not name or state is None:
            raise NpaParseError(f"scontrol node line without NodeName/State: {_quote_output(line)}")
        parts = _field(line, "Partitions")
        # Reason may contain spaces ("test [root@2026-01-01T00:00:00]"); it runs to the next Key= field.
        m = re.search(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Za-z]+=|$)", line)
        nodes[name] = NodeInfo(
            name=name,
            state=state,
            partitions=tuple(p for p in (parts or "").split(",") if p and p != "(null)"),
            reason=_none_if(m.group(1)) if m else None,
        )
    return nodes


def parse_slurm_minutes(text: str) -> int | None:
    """Slurm time limit -> whole minutes (seconds round up); UNLIMITED/INFINITE -> None.

    Formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
    """
    value = text.strip()
    if value.upper() in {"UNLIMITED", "INFINITE", "NONE"}:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not m:
        raise NpaParseError(f"cannot read Slurm time limit {_quote_output(text)}")
    days, a, b, c = m.groups()
    if days is not None:  # D-H[:M[:S]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:M:S
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # M:S
        seconds = int(a) * 60 + int(b)
    else:  # M
        seconds = int(a) * 60
    return -(-seconds // 60)


def parse_partitions(stdout: str) -> dict[str, PartitionInfo]:
    partitions: dict[str, PartitionInfo] = {}
    for line in stdout.splitlines():
        if not line.strip() or _is_cluster_banner(line):
            continue
        name = _field(line, "PartitionName")
        max_time = _field(line, "MaxTime")
        if not name or max_time is None:
            raise NpaParseError(f"scontrol partition line without PartitionName/MaxTime: {_quote_output(line)}")
        partitions[name] = PartitionInfo(
            name=name,
            max_time_minutes=parse_slurm_minutes(max_time),
            default=(_field(line, "Default") or "").upper() == "YES",
            state=_field(line, "State") or "",
            nodes=_none_if(_field(line, "Nodes") or "", "(null)"),
        )
    return partitions


# ---------------------------------------------------------------------------------------------------------
# Files


def build_write_file(path: str, mode: int = 0o600) -> str:
    """Read stdin and write it to ``path`` atomically: umask 077, mkdir -p, temp file in the same dir, mv."""
    validate_remote_path(path)
    if path.endswith("/"):
        raise NpaValidationError(f"path={path!r} names a directory; give a file path")
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise NpaValidationError(f"mode={mode!r} must be a permission value such as 0o600")
    parent, _, base = path.rpartition("/")
    parent = parent or "/"
    qpath, qparent = shlex.quote(path), shlex.quote(parent)
    tmp_template = shlex.quote(f"{parent.rstrip('/')}/.{base[:64]}.npa-tmp.XXXXXX")
    script = (
        f"umask 077; mkdir -p -- {qparent} || exit 1; "
        f"t=$(mktemp {tmp_template}) || exit 1; "
        f'if cat > "$t" && chmod {mode:o} "$t" && mv -fT -- "$t" {qpath}; then exit 0; fi; '
        'rm -f -- "$t"; exit 1'
    )
    return _bash(script)


def build_path_exists(paths: Sequence[str]) -> str:
    """Prints one line per path, in order: ``1`` if it exists (``test -e``), else ``0``."""
    if not paths:
        raise NpaValidationError("paths is empty: give at least one path")
    quoted = " ".join(shlex.quote(validate_remote_path(p)) for p in paths)
    script = f'for p in {quoted}; do if [ -e "$p" ]; then echo 1; else echo 0; fi; done'
    return _bash(script)


def parse_path_exists(stdout: str, paths: Sequence[str]) -> dict[str, bool]:
    answers = [line.strip() for line in stdout.splitlines() if line.strip() in {"0", "1"}]
    if len(answers) != len(paths):
        raise NpaParseError(
            f"path check printed {len(answers)} answers for {len(paths)} paths: {_quote_output(stdout)}"
        )
    return {p: a == "1" for p, a in zip(paths, answers, strict=True)}
