"""Pure builder: check inputs, stage files and (optionally) run sbatch in ONE remote shell command.

File contents travel base64-encoded on stdin, one line per file, so nothing (secrets included) ever appears on a
command line, and binary content survives. Each file is written to a temporary name in its own directory, chmod-ed,
then renamed into place: a reader never sees a partial file.
"""

from __future__ import annotations

import base64
import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from npa_airflow.exceptions import NpaParseError
from npa_airflow.slurm.commands.builders import (
    build_if_cancel_marker,
    build_sbatch_submit,
    build_shred_files,
    cancel_marker_for,
)
from npa_airflow.slurm.commands.validation import validate_remote_path

EXIT_MISSING_INPUTS = 3
EXIT_STAGING_FAILED = 4
EXIT_CANCELLED_BEFORE_SBATCH = 5  # Airflow's cancel marker for this job exists: the task was killed
MISSING_PREFIX = "NPA_MISSING "
SBATCH_BEGIN = "NPA_SBATCH_BEGIN"
SBATCH_RC_PREFIX = "NPA_SBATCH_RC "


@dataclass(frozen=True)
class StagedFile:
    path: str
    data: bytes = field(repr=False)
    mode: int = 0o600


# Every early exit first reads the rest of stdin: a script that exits while the client still writes closes the
# SSH channel under the writer, and the client could not tell "refused before sbatch" from "connection lost".
DRAIN = "cat >/dev/null; "


def _existence_check(paths: Sequence[str], drain: str) -> list[str]:
    if not paths:
        return []
    quoted = " ".join(shlex.quote(validate_remote_path(p, "required input")) for p in paths)
    return [
        "missing=0",
        f"for p in {quoted}; do",
        f'  [ -e "$p" ] || {{ printf \'{MISSING_PREFIX}%s\\n\' "$p"; missing=1; }}',
        "done",
        f'[ "$missing" = 0 ] || {{ {drain}exit {EXIT_MISSING_INPUTS}; }}',
    ]


def _write_stanza(staged: StagedFile, drain: str) -> str:
    path = validate_remote_path(staged.path, "staged file")
    target = shlex.quote(path)
    directory = shlex.quote(posixpath.dirname(path) or "/")
    temp_pattern = shlex.quote(path + ".tmp.XXXXXX")
    return (
        # t= first: under set -u, the cleanup of a failed mkdir/mktemp must not die on an unset $t.
        f"t=; IFS= read -r line || exit {EXIT_STAGING_FAILED}; "
        f"mkdir -p -- {directory} && t=$(mktemp {temp_pattern}) && "
        f'printf %s "$line" | base64 -d > "$t" && chmod {staged.mode:o} "$t" && mv -f -- "$t" {target} '
        f'|| {{ [ -z "$t" ] || rm -f -- "$t"; {drain}exit {EXIT_STAGING_FAILED}; }}'
    )


def build_stage(
    files: Sequence[StagedFile], *, required_paths: Sequence[str] = (), mkdirs: Sequence[str] = ()
) -> tuple[str, bytes]:
    """Command and stdin that check ``required_paths`` exist, create ``mkdirs`` and write ``files`` atomically.

    With ``files``, every early exit drains stdin first (the client always ends stdin with EOF); without them
    nothing is read, so a caller that sends no stdin never waits on it.
    """
    drain = DRAIN if files else ""
    lines = ["set -u", *_existence_check(required_paths, drain), "umask 077"]
    for directory in mkdirs:
        lines.append(
            f"mkdir -p -- {shlex.quote(validate_remote_path(directory, 'directory'))} "
            f"|| {{ {drain}exit {EXIT_STAGING_FAILED}; }}"
        )
    lines.extend(_write_stanza(f, drain) for f in files)
    stdin = b"".join(base64.b64encode(f.data) + b"\n" for f in files)
    return "\n".join(lines), stdin


def build_submit(
    stage: tuple[str, bytes],
    script_path: str,
    *,
    sbatch_args: Sequence[str] = (),
    cluster: str | None = None,
    cancel_by_name: str | None = None,
    secret_files: Sequence[str] = (),
) -> tuple[str, bytes]:
    """``stage`` (the command and stdin of :func:`build_stage`), then ``sbatch --parsable`` the script; sbatch's
    rc is reported on stdout.

    With ``cancel_by_name`` (the shell command that scancels this job by its name and owner proof), the command
    honours Airflow's cancel marker of the script (`commands.cancel_marker_for`), which a killed task creates before
    it cancels by name:
    present before sbatch, nothing is submitted; present once sbatch returns, the job is cancelled here. Whenever
    the marker appears, one of the two sees it or the kill's own scancel finds the job, so a task killed while
    sbatch runs never leaves its job behind, even when the worker dies before sbatch answers. sbatch's output is
    captured so that the check after it runs before anything is written to a session that may be gone.
    A job cancelled that way never runs: its ``secret_files`` (the sidecar just staged) are shredded too.
    """
    command, stdin = stage
    argv = build_sbatch_submit(script_path, sbatch_args, cluster)
    submit = [f"printf '{SBATCH_BEGIN}\\n'", f"out=$({shlex.join(argv)}); rc=$?"]
    if cancel_by_name is not None:
        marker = cancel_marker_for(script_path)
        shred = f"{build_shred_files(secret_files)}; " if secret_files else ""
        submit.insert(0, build_if_cancel_marker(marker, f"{{ {shred}exit {EXIT_CANCELLED_BEFORE_SBATCH}; }}"))
        submit.append(build_if_cancel_marker(marker, f"{{ ( {cancel_by_name} ) >/dev/null 2>&1; {shred}}}"))
    submit += ['printf %s "$out"', f"printf '\\n{SBATCH_RC_PREFIX}%s\\n' \"$rc\""]
    return command + "\n" + "\n".join(submit), stdin


@dataclass(frozen=True)
class StageOutcome:
    missing: tuple[str, ...] = ()
    sbatch_started: bool = False
    sbatch_rc: int | None = None
    sbatch_stdout: str = ""


def parse_stage_output(stdout: str) -> StageOutcome:
    # Only "\n" ends a line here: str.splitlines() would also split a path at U+0085, U+2028, ...
    lines = stdout.split("\n")
    missing = tuple(line[len(MISSING_PREFIX) :] for line in lines if line.startswith(MISSING_PREFIX))
    if SBATCH_BEGIN not in stdout:
        return StageOutcome(missing=missing)
    after = stdout.split(SBATCH_BEGIN + "\n", 1)[1] if SBATCH_BEGIN + "\n" in stdout else ""
    rc: int | None = None
    body = after
    marker = "\n" + SBATCH_RC_PREFIX
    if marker in after:
        body, rc_text = after.rsplit(marker, 1)
        rc_text = rc_text.strip()
        if not rc_text.lstrip("-").isdigit():
            raise NpaParseError(f"could not read sbatch's exit status from {after!r}")
        rc = int(rc_text)
    return StageOutcome(missing=missing, sbatch_started=True, sbatch_rc=rc, sbatch_stdout=body)
