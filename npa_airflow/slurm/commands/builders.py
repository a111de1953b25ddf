"""Builders of the remote commands for sbatch, sacct, squeue, scancel, scontrol, and log tails.

No I/O here: the hook runs what these build. Builders return an argv list (the hook joins it with
``shlex.join``) or a string assembled only from ``shlex.quote``d parts. Every job id, cluster and job
name is validated against a strict pattern before it reaches a builder; paths are absolute and free of
NUL and newlines.

Every command is bash: the hook runs each one under bash whatever the login user's shell is
(:func:`npa_airflow.slurm.transport.ssh.login_shell_command`), so builders never wrap their own.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Sequence

from npa_airflow.common.checks import fullmatch_or_raise
from npa_airflow.common.naming import validate_job_name
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands.records import (
    BATCH_END,
    BATCH_MARK,
    CANCEL_BY_AIRFLOW,
    CANCEL_SACCT_ERROR,
    CANCEL_STATE,
    CANCEL_USER,
    FIND_SACCT_FIELDS,
    FIND_SQUEUE_FIELDS,
    SACCT_FIELDS,
    SQUEUE_FORM_MARK,
    SQUEUE_FORMAT,
    TAIL_END,
    TAIL_MARK,
)
from npa_airflow.slurm.commands.validation import (
    cluster_args,
    job_id_list,
    name_list,
    validate_job_id,
    validate_remote_path,
)

_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,127}")
# Without -j, sacct's window starts at midnight today: name searches give an explicit start.
DEFAULT_NAME_SEARCH_START = "now-7days"

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


# ---------------------------------------------------------------------------------------------------------
# sbatch


# ---------------------------------------------------------------------------------------------------------
# sacct / squeue


def build_sbatch_submit(script_path: str, sbatch_args: Sequence[str] = (), cluster: str | None = None) -> list[str]:
    """``sbatch --parsable [args] <script>``; extra args must be single ``--option[=value]`` words."""
    for arg in sbatch_args:
        if not isinstance(arg, str) or not arg.startswith("--") or any(c in arg for c in "\x00\n\r"):
            raise NpaValidationError(f"sbatch argument {arg!r} must be one '--option[=value]' without newlines")
    return ["sbatch", "--parsable", *cluster_args(cluster), *sbatch_args, validate_remote_path(script_path)]


def _sacct_base(cluster: str | None, fields: Sequence[str] = SACCT_FIELDS) -> list[str]:
    return ["sacct", "-X", "--parsable2", "--noheader", *cluster_args(cluster), "-o", ",".join(fields)]


def build_sacct_states(job_ids: Iterable[str], cluster: str | None = None, user: str | None = None) -> list[str]:
    """ONE sacct for many jobs (``user``'s only, if given). With -j, sacct's default window starts at the epoch."""
    return [*_sacct_base(cluster), *([_user_arg(user)] if user else []), "-j", job_id_list(job_ids)]


def _squeue_all_states(cluster: str | None, *selectors: str, fmt: str = SQUEUE_FORMAT) -> list[str]:
    return ["squeue", "-h", "-t", "all", *cluster_args(cluster), *selectors, "-o", fmt]


def build_squeue_states(job_ids: Iterable[str], cluster: str | None = None, user: str | None = None) -> list[str]:
    """ONE squeue for many jobs (``user``'s only, if given), all states (finished jobs stay visible for MinJobAge)."""
    return _squeue_all_states(cluster, *([_user_arg(user)] if user else []), f"--jobs={job_id_list(job_ids)}")


def build_squeue_only_states(job_ids: Iterable[str]) -> list[str]:
    """ONE ``squeue --only-job-state`` for many jobs, all states: slurmctld's lighter state RPC (Slurm 24.05+).

    It answers with the ids and states only (Reason ``None``, no nodes, name ``(null)``), and for the login host's
    default cluster only: 24.11.5 ignores ``-M`` with this option (it prints "CLUSTER: b" over the default
    cluster's jobs), so it takes no cluster.
    """
    return ["squeue", "-h", "-t", "all", "--only-job-state", f"--jobs={job_id_list(job_ids)}", "-o", SQUEUE_FORMAT]


def build_squeue_states_detecting(job_ids: Iterable[str]) -> str:
    """:func:`build_squeue_only_states` where the login host's squeue has the option, else
    :func:`build_squeue_states`; a first line says which ran (:func:`parsers.split_squeue_form`). The check reads
    ``squeue --help`` (no RPC); a hook asks it once per connection, then sends the form it learnt."""
    ids = list(job_ids)
    only, full = shlex.join(build_squeue_only_states(ids)), shlex.join(build_squeue_states(ids))
    return (
        f"if squeue --help 2>/dev/null | grep -q -e --only-job-state; then echo {SQUEUE_FORM_MARK} only-job-state; "
        f"exec {only}; fi; echo {SQUEUE_FORM_MARK} full; exec {full}"
    )


def _user_arg(user: str) -> str:
    return f"--user={fullmatch_or_raise(user, _USER_RE, f'user={user!r} is not a user name Slurm accepts')}"


def build_find_by_name_sacct(
    names: Iterable[str], user: str, cluster: str | None = None, start: str = DEFAULT_NAME_SEARCH_START
) -> list[str]:
    """``user``'s accounting records with any of these exact names since ``start`` (sacct time syntax), with
    their submit time and comment (:data:`FIND_SACCT_FIELDS`). Without ``--user`` sacct shows every user's jobs
    to an operator account, and anyone can name a job after ours."""
    if not re.fullmatch(r"[A-Za-z0-9:+-]{1,32}", start):
        raise NpaValidationError(f"start={start!r} is not a sacct time (e.g. 'now-7days', '2026-01-01T00:00')")
    sacct = _sacct_base(cluster, FIND_SACCT_FIELDS)
    return ["env", "SLURM_TIME_FORMAT=%s", *sacct, "-S", start, _user_arg(user), f"--name={name_list(names)}"]


def build_find_by_name_squeue(names: Iterable[str], user: str, cluster: str | None = None) -> list[str]:
    """``user``'s jobs slurmctld knows with any of these exact names, with submit time and comment."""
    fmt = "|".join(FIND_SQUEUE_FIELDS)
    selectors = (_user_arg(user), f"--name={name_list(names)}")
    return ["env", "SLURM_TIME_FORMAT=%s", *_squeue_all_states(cluster, *selectors, fmt=fmt)]


# ---------------------------------------------------------------------------------------------------------
# scancel


CANCEL_MARKER_SUFFIX = ".npa-cancelled"


def build_cancel(*job_ids: str, cluster: str | None = None) -> list[str]:
    """ONE scancel for one or many jobs (22.05 exits 0 when none of them is known: see slurm/transport/cancels.py)."""
    if not job_ids:
        raise NpaValidationError("no job id to cancel")
    return ["scancel", *cluster_args(cluster), *dict.fromkeys(validate_job_id(j) for j in job_ids)]


def build_cancel_and_shred(job_ids: Sequence[str], shred: Sequence[str], cluster: str | None = None) -> str:
    """scancel, then, only when scancel succeeded, shred the jobs' secret files; exits with scancel's status.

    A cancelled job never runs again, so its secrets sidecar can go in the same round trip.
    """
    cancel = shlex.join(build_cancel(*job_ids, cluster=cluster))
    if not shred:
        return cancel
    return f"{cancel} || exit $?; {build_shred_files(shred)}"


# ---------------------------------------------------------------------------------------------------------
# Secret files of ended jobs


def build_shred_files(paths: Sequence[str]) -> str:
    """Shell that overwrites and removes each file (`shred -u`, else `rm -f`); silent, and it never fails.

    For the secrets sidecar of a job that has ended for good: it rides along in a command that runs anyway
    (the poller's tail, a cancel), so it must neither print nor change that command's status.
    """
    parts = []
    for path in paths:
        quoted = shlex.quote(validate_remote_path(path, "file to shred"))
        parts.append(f"if [ -e {quoted} ]; then {{ shred -u -- {quoted} || rm -f -- {quoted}; }} >/dev/null 2>&1; fi")
    return "; ".join([*parts, ":"])


def build_cancel_by_name(job_name: str, user: str, comment: str, cluster: str | None = None) -> str:
    """scancel of ``user``'s jobs named exactly ``job_name`` whose comment is exactly ``comment`` (the owner proof
    the submitting try gave them: a job of that name and user but without it is not ours); exits 0 when there is
    none, with scancel's status otherwise."""
    if not isinstance(comment, str) or not re.fullmatch(r"[A-Za-z0-9:._-]{1,128}", comment):
        raise NpaValidationError(f"comment={comment!r} is not an owner proof")
    squeue = ["squeue", "-h", *cluster_args(cluster), _user_arg(user), f"--name={validate_job_name(job_name)}"]
    listing = shlex.join([*squeue, "-o", "%A|%k"])
    pick = shlex.join(["awk", "-F|", "-v", f"c={comment}", "$2 == c { print $1 }"])
    scancel = shlex.join(["scancel", *cluster_args(cluster)])
    return f'ids=$(set -o pipefail; {listing} | {pick}) || exit $?; [ -z "$ids" ] || {scancel} $ids'


def cancel_marker_for(script_path: str) -> str:
    """The file Airflow creates before it cancels the job submitted from ``script_path``.

    A later try reads it to tell Airflow's cancels from anyone else's, and the submission command reads it
    around sbatch so that a task killed while sbatch runs never leaves the job behind.
    """
    return validate_remote_path(script_path, "script path") + CANCEL_MARKER_SUFFIX


def build_if_cancel_marker(marker: str, command: str) -> str:
    """Shell that runs ``command`` (shell) only when Airflow's cancel ``marker`` exists; a missing marker is no
    failure, so the line's status is ``command``'s or 0."""
    return f"[ ! -e {shlex.quote(validate_remote_path(marker, 'cancel marker'))} ] || {command}"


def build_record_cancel(marker: str) -> str:
    """Silent fragment that creates ``marker`` (and its directory); it never fails, so what follows always runs."""
    path = validate_remote_path(marker, "cancel marker")
    return f"{{ mkdir -p -- {shlex.quote(posixpath.dirname(path))} && : > {shlex.quote(path)}; }} 2>/dev/null"


def build_cancel_origin(job_id: str, marker: str | None, cluster: str | None = None, *, accounting: bool = True) -> str:
    """Who cancelled a job: whether Airflow's marker exists, sacct's State ("CANCELLED by <uid>") and that
    uid's user name. Read by :func:`npa_airflow.slurm.commands.parsers.parse_cancel_origin`.

    Without accounting (``accounting=False``) the state is slurmctld's (squeue, while it keeps the ended job), which
    names no uid: only Airflow's marker tells its cancels from anyone else's. With it, a sacct that prints no state
    also prints why (its first error line), so that a cluster without accounting is recognised from this answer.
    """
    job = validate_job_id(job_id)
    if accounting:
        query = ["sacct", "-X", "--noheader", "--parsable2", *cluster_args(cluster), "-j", job, "-o", "State"]
    else:
        query = ["squeue", "-h", "-t", "all", *cluster_args(cluster), f"--jobs={job}", "-o", "%T"]
    parts = []
    if marker is not None:
        parts.append(build_if_cancel_marker(marker, f"echo {CANCEL_BY_AIRFLOW}"))
    parts += [
        f"state=$({shlex.join(query)} 2>/dev/null | head -n 1)",
        f'printf "{CANCEL_STATE} %s\\n" "$state"',
        'uid=${state#CANCELLED by }; case $uid in ""|*[!0-9]*) uid= ;; esac',
        f'[ -z "$uid" ] || printf "{CANCEL_USER} %s %s\\n" "$uid" "$(getent passwd "$uid" | cut -d: -f1)"',
    ]
    if accounting:
        why = f"$({shlex.join(query)} 2>&1 >/dev/null | head -n 1)"
        parts.append(f'[ -n "$state" ] || printf "{CANCEL_SACCT_ERROR} %s\\n" "{why}"')
    return "; ".join(parts)


def build_submit_time(job_id: str, cluster: str | None = None, *, accounting: bool = True) -> str:
    """A job's submit time as "id|epoch seconds" lines, from sacct and from squeue (accounting may lag); from
    squeue alone on a cluster without accounting."""
    job = validate_job_id(job_id)
    sacct = ["sacct", "-X", "--noheader", "--parsable2", *cluster_args(cluster), "-j", job, "-o", "JobID,Submit"]
    squeue = ["squeue", "-h", "-t", "all", *cluster_args(cluster), f"--jobs={job}", "-o", "%i|%V"]
    reads = [f"{shlex.join(sacct)} 2>/dev/null"] if accounting else []
    return "; ".join(["export SLURM_TIME_FORMAT=%s", *reads, f"{shlex.join(squeue)} 2>/dev/null"])


def build_scontrol_job(job_id: str, cluster: str | None = None) -> list[str]:
    """``scontrol show job`` of one job, one line: its state and exit code while slurmctld keeps it (MinJobAge)."""
    return ["scontrol", *cluster_args(cluster), "--oneliner", "show", "job", validate_job_id(job_id)]


# ---------------------------------------------------------------------------------------------------------
# Log tails


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
    return "; ".join([_TAIL_FUNCTION, *calls, f"echo {TAIL_END}"])


# ---------------------------------------------------------------------------------------------------------
# scontrol: nodes and partitions


def build_batch(commands: Sequence[Sequence[str] | str]) -> str:
    """ONE remote command that runs read-only ``commands`` in turn (argv lists, or shell text) and prints, for
    each, its exit status, stdout and stderr (base64 frames), then an end marker. Read by ``parse_batch``.

    For reads a step needs together (the partitions and the nodes, both answers of a name lookup): one SSH
    round trip instead of one per command.
    """
    if not commands:
        raise NpaValidationError("commands is empty: give at least one command to run")
    return build_frames([command if isinstance(command, str) else shlex.join(command) for command in commands])


def build_frames(bodies: Sequence[str], *, feeds: Sequence[str] | None = None, prelude: Sequence[str] = ()) -> str:
    """The shell of a batch: after ``prelude``, each of ``bodies`` (shell text) runs in its own subshell, its
    stdin empty or, with ``feeds``, the output of its feed command; then its frame (exit status, stdout, stderr
    base64), and an end marker after the last. ``parse_batch`` and ``parse_batch_frames`` read it."""
    parts = ["d=$(mktemp -d) || exit 1", "trap 'rm -rf \"$d\"' EXIT", *prelude]
    for index, body in enumerate(bodies):
        run = f'(\n{body}\n) >"$d/o" 2>"$d/e"'
        run = f"{feeds[index]} | {run}" if feeds is not None else f"{run} </dev/null"
        parts.append(
            f'{run}; printf "{BATCH_MARK} {index} %s\\n" "$?"; base64 -w0 "$d/o"; echo; base64 -w0 "$d/e"; echo'
        )
    parts.append(f"echo {BATCH_END}")
    return "; ".join(parts)


def build_scontrol_nodes(cluster: str | None = None) -> list[str]:
    return ["scontrol", *cluster_args(cluster), "--oneliner", "show", "nodes"]


def build_partitions(cluster: str | None = None) -> list[str]:
    return ["scontrol", *cluster_args(cluster), "--oneliner", "show", "partitions"]


# ---------------------------------------------------------------------------------------------------------
# Files
