"""Several submissions in one shell command, executed by real local bash with a local stand-in for sbatch that
records the script it was given (the login host runs the same bash; tests/integration runs it there)."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands import parse_batch, parse_batch_frames
from npa_airflow.slurm.submit.staging import (
    EXIT_MISSING_INPUTS,
    EXIT_STAGING_FAILED,
    StagedFile,
    build_stage,
    build_submit,
    parse_stage_output,
)
from npa_airflow.slurm.submit.submit_batch import build_submit_batch


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # sbatch --parsable <script>: an id from the script's own name, and the script's content kept aside
    (fake_bin / "sbatch").write_text(
        '#!/bin/bash\nfor a; do s=$a; done\ncp "$s" "$s.seen"\nbasename "$s" .sbatch | tr -dc 0-9; echo\n'
    )
    (fake_bin / "sbatch").chmod(0o755)
    return {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}


def _bash(command: str, stdin: bytes, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, env=env, check=False)


def _submission(tmp_path, number: int, secret: bytes, required: tuple[str, ...] = ()) -> tuple[str, bytes]:
    script = tmp_path / f"job{number}.sbatch"
    files = [StagedFile(str(script), f"#!/bin/bash\necho {number}\n".encode(), 0o700)]
    files.append(StagedFile(str(tmp_path / f"job{number}.env"), secret, 0o600))
    return build_submit(build_stage(files, required_paths=required), str(script))


def test_each_submission_gets_its_own_files_and_its_own_answer(tmp_path, env):
    secrets = [b"TOKEN=one\n", bytes(range(256)), b"TOKEN=three"]
    batch = [_submission(tmp_path, i + 1, secret) for i, secret in enumerate(secrets)]
    command, stdin = build_submit_batch(batch)
    for secret in secrets:
        assert secret not in command.encode()
    done = _bash(command, stdin, env)
    assert done.returncode == 0, done.stderr
    frames = parse_batch(done.stdout, 3)
    for number, (rc, out, _err) in enumerate(frames, start=1):
        outcome = parse_stage_output(out.decode())
        assert (rc, outcome.sbatch_rc, outcome.sbatch_stdout.strip()) == (0, 0, str(number))
        assert (tmp_path / f"job{number}.sbatch.seen").read_text() == f"#!/bin/bash\necho {number}\n"
        sidecar = tmp_path / f"job{number}.env"
        assert sidecar.read_bytes() == secrets[number - 1]
        assert stat.S_IMODE(sidecar.stat().st_mode) == 0o600


def test_a_refused_submission_takes_its_lines_off_and_the_next_still_gets_its_own(tmp_path, env):
    """The first refuses before reading a file (missing input); the second fails while writing its first file
    (its directory cannot be made); the third must still read exactly its own lines."""
    refused = _submission(tmp_path, 1, b"ONE", required=(str(tmp_path / "absent"),))
    (tmp_path / "blocker").write_text("a file where a directory should be")
    broken_files = [
        StagedFile(str(tmp_path / "blocker" / "job2.sbatch"), b"#!/bin/bash\n"),
        StagedFile(str(tmp_path / "job2.env"), b"TWO"),
    ]
    broken = build_submit(build_stage(broken_files), str(tmp_path / "blocker" / "job2.sbatch"))
    command, stdin = build_submit_batch([refused, broken, _submission(tmp_path, 3, b"THREE")])
    frames = parse_batch(_bash(command, stdin, env).stdout, 3)
    assert [rc for rc, _, _ in frames] == [EXIT_MISSING_INPUTS, EXIT_STAGING_FAILED, 0]
    assert not (tmp_path / "job1.sbatch").exists() and not (tmp_path / "job2.env").exists()
    assert (tmp_path / "job3.env").read_bytes() == b"THREE"
    assert parse_stage_output(frames[2][1].decode()).sbatch_stdout.strip() == "3"


def test_a_line_of_another_submission_is_never_written_as_a_file(tmp_path, env):
    command, stdin = build_submit_batch([_submission(tmp_path, 1, b"ONE"), _submission(tmp_path, 2, b"TWO")])
    first, second = stdin.split(b"\n")[:2], stdin.split(b"\n")[2:]
    shifted = b"\n".join(first[:1] + second)  # the first's sidecar line lost: the second's script comes next
    frames, ended = parse_batch_frames(_bash(command, shifted, env).stdout, 2)
    assert ended and [rc for rc, _, _ in frames] == [EXIT_STAGING_FAILED, EXIT_STAGING_FAILED]
    assert not (tmp_path / "job1.env").exists() and not (tmp_path / "job2.env").exists()
    assert not (tmp_path / "job2.sbatch").exists()  # the second's sidecar line came first: refused, not written
    assert not (tmp_path / "job1.sbatch.seen").exists() and not (tmp_path / "job2.sbatch.seen").exists()


def test_a_cut_output_gives_the_whole_frames_before_the_cut(tmp_path, env):
    command, stdin = build_submit_batch([_submission(tmp_path, 1, b"ONE"), _submission(tmp_path, 2, b"TWO")])
    whole = _bash(command, stdin, env).stdout
    frames, ended = parse_batch_frames(whole, 2)
    assert ended and len(frames) == 2
    cut = whole[: whole.index(b"NPA-BATCH 1 ") + 20]
    frames, ended = parse_batch_frames(cut, 2)
    assert not ended and len(frames) == 1 and frames[0][0] == 0
    assert parse_batch_frames(whole[: whole.index(b"NPA-BATCH 0 ") + 30], 2) == ([], False)


def test_bad_batches_are_refused():
    with pytest.raises(NpaValidationError, match="empty"):
        build_submit_batch([])
    with pytest.raises(NpaValidationError, match="whole lines"):
        build_submit_batch([("true", b"no newline at the end")])
