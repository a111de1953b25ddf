"""Pure builder: several submissions (each a command and stdin of :func:`staging.build_submit`) in ONE remote
shell command, run one after another, each answering in its own frame (`commands.build_frames`, the shell of
`commands.build_batch`'s reads too).

Each submission's stdin (one base64 line per staged file) travels in the batch's stdin, every line tagged with
its submission's index and its own number. Before a submission runs, a feeder reads exactly its lines with the
shell's ``read`` (which never reads past a newline on a pipe), checks their tags and pipes them to it, so the
submission sees its own files and an end of input, as when it runs alone. The feeder reads all of its lines even
when the submission exits early, so the next one starts at its own first line; a line with another tag (a line
lost on the way) stops the feeder and leaves its submission short of input, which refuses before sbatch: no file
is ever written from another file's line.
"""

from __future__ import annotations

from collections.abc import Sequence

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands.builders import build_frames

# feed INDEX COUNT: COUNT lines of stdin tagged "INDEX.0 ", "INDEX.1 ", ... to stdout, untagged. SIGPIPE ignored:
# a submission that stopped reading does not stop the feeder, which must take its lines off the shared stdin.
_FEEDER = (
    "feed() { trap '' PIPE; n=0; "
    'while [ "$n" -lt "$2" ] && IFS= read -r l; do '
    'case $l in "$1.$n "*) printf \'%s\\n\' "${l#* }" 2>/dev/null ;; *) return 1 ;; esac; '
    "n=$((n+1)); done; }"
)


def _tagged(index: int, stdin: bytes) -> tuple[bytes, int]:
    lines = stdin.split(b"\n")
    if lines[-1] != b"":
        raise NpaValidationError("a submission's stdin must be whole lines (one base64 line per staged file)")
    return b"".join(f"{index}.{n} ".encode() + line + b"\n" for n, line in enumerate(lines[:-1])), len(lines) - 1


def build_submit_batch(submissions: Sequence[tuple[str, bytes]]) -> tuple[str, bytes]:
    """Command and stdin that run ``submissions`` in turn; ``commands.parse_batch_frames`` reads the answers."""
    if not submissions:
        raise NpaValidationError("submissions is empty: give at least one submission to run")
    tagged = [_tagged(index, own_stdin) for index, (_, own_stdin) in enumerate(submissions)]
    feeds = [f"feed {index} {count}" for index, (_, count) in enumerate(tagged)]
    command = build_frames([command for command, _ in submissions], feeds=feeds, prelude=[_FEEDER])
    return command, b"".join(lines for lines, _ in tagged)
