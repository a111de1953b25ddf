"""The stage/submit builder, executed by real local bash (the same shell the login host runs)."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands import validate_remote_path
from npa_airflow.slurm.submit.staging import (
    EXIT_MISSING_INPUTS,
    EXIT_STAGING_FAILED,
    StagedFile,
    build_stage,
    build_submit,
    parse_stage_output,
)


def _bash(command: str, stdin: bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, env=env, check=False)


def test_files_are_written_atomically_with_mode_and_exact_bytes(tmp_path):
    script = tmp_path / "a" / "b" / "job.sbatch"
    secret = tmp_path / "a" / "job.env"
    payload = bytes(range(256)) * 3 + b"no trailing newline"
    command, stdin = build_stage(
        [StagedFile(str(script), b"#!/bin/bash\necho hi\n", 0o644), StagedFile(str(secret), payload, 0o600)]
    )
    done = _bash(command, stdin)
    assert done.returncode == 0, done.stderr
    assert script.read_bytes() == b"#!/bin/bash\necho hi\n"
    assert secret.read_bytes() == payload
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o644
    assert sorted(p.name for p in secret.parent.iterdir()) == ["b", "job.env"]  # no temp files left


def test_secret_content_never_appears_in_the_command():
    command, stdin = build_stage([StagedFile("/x/job.env", b"export HF_TOKEN=hf_canary_123\n")])
    assert "hf_canary_123" not in command
    assert b"hf_canary_123" not in stdin  # base64 on stdin, not even plain there


def test_missing_inputs_stop_before_anything_is_written(tmp_path):
    present = tmp_path / "present"
    present.mkdir()
    target = tmp_path / "out" / "job.sbatch"
    odd = str(tmp_path / "it's $(touch pwned) `x`")
    command, stdin = build_stage(
        [StagedFile(str(target), b"x")], required_paths=[str(present), odd, str(tmp_path / "nope")]
    )
    done = _bash(command, stdin)
    assert done.returncode == EXIT_MISSING_INPUTS
    assert parse_stage_output(done.stdout.decode()).missing == (odd, str(tmp_path / "nope"))
    assert not target.parent.exists()
    assert not (tmp_path / "pwned").exists()


def test_stage_and_submit_reports_sbatch_output_and_rc(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # A local stand-in for sbatch: prints a banner and an id like the real one with --parsable.
    (fake_bin / "sbatch").write_text('#!/bin/bash\necho "site banner"\necho "4242;clusterA"\n')
    (fake_bin / "sbatch").chmod(0o755)
    script = tmp_path / "job.sbatch"
    command, stdin = build_submit(build_stage([StagedFile(str(script), b"#!/bin/bash\n")]), str(script))
    done = _bash(command, stdin, env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"})
    outcome = parse_stage_output(done.stdout.decode())
    assert outcome.sbatch_started and outcome.sbatch_rc == 0
    assert outcome.sbatch_stdout.strip().splitlines() == ["site banner", "4242;clusterA"]


def test_truncated_output_has_no_rc():
    outcome = parse_stage_output("NPA_SBATCH_BEGIN\n12")
    assert outcome.sbatch_started and outcome.sbatch_rc is None


@pytest.mark.parametrize("bad", ["relative/path", "/a/b\nc", "/nul\0byte", ""])
def test_bad_remote_paths_are_refused(bad):
    with pytest.raises(NpaValidationError):
        validate_remote_path(bad)


def _write_all_then_wait(command: str, stdin: bytes) -> tuple[int, bytes, BaseException | None]:
    """Feed stdin the way the SSH client does (all of it, then EOF); report a write failure instead of hiding it."""
    proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    error: BaseException | None = None
    try:
        for start in range(0, len(stdin), 1 << 16):
            proc.stdin.write(stdin[start : start + (1 << 16)])
        proc.stdin.close()
    except BrokenPipeError as exc:
        error = exc
    out = proc.stdout.read()
    return proc.wait(), out, error


@pytest.mark.parametrize("submit", [False, True])
def test_missing_input_exit_reads_all_stdin_first(tmp_path, submit):
    """A large staged file behind a missing input: the script still consumes stdin, so the writer sees no EPIPE."""
    big = StagedFile(str(tmp_path / "big.bin"), os.urandom(6 << 20))
    script = StagedFile(str(tmp_path / "job.sbatch"), b"#!/bin/bash\n")
    missing = str(tmp_path / "no-such-input")
    if submit:
        command, stdin = build_submit(build_stage([big, script], required_paths=[missing]), script.path)
    else:
        command, stdin = build_stage([big, script], required_paths=[missing])
    rc, out, error = _write_all_then_wait(command, stdin)
    assert error is None
    assert rc == EXIT_MISSING_INPUTS
    outcome = parse_stage_output(out.decode())
    assert outcome.missing == (missing,) and not outcome.sbatch_started
    assert not (tmp_path / "big.bin").exists()


def test_failed_write_exit_reads_all_stdin_first(tmp_path):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    files = [StagedFile(str(blocker / "a"), b"a"), StagedFile(str(tmp_path / "big.bin"), os.urandom(6 << 20))]
    command, stdin = build_stage(files)
    rc, _, error = _write_all_then_wait(command, stdin)
    assert error is None
    assert rc == EXIT_STAGING_FAILED


def test_path_check_without_files_reads_no_stdin(tmp_path):
    command, stdin = build_stage([], required_paths=[str(tmp_path / "nope")])
    assert stdin == b"" and "cat" not in command


@pytest.mark.parametrize("marker_appears", ["before sbatch", "while sbatch runs"])
def test_a_cancel_marker_shreds_the_staged_sidecar_of_the_job_that_never_runs(tmp_path, marker_appears):
    """A task killed while its submission is in flight: the job is never submitted (or cancelled at once), so
    the secrets sidecar just staged must not stay behind."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    script, sidecar, calls = tmp_path / "job.sbatch", tmp_path / "job.env", tmp_path / "calls"
    marker = f"{script}.npa-cancelled"
    touch = f"touch {marker}; " if marker_appears == "while sbatch runs" else ""
    (fake_bin / "sbatch").write_text(f'#!/bin/bash\n{touch}echo "4242"\n')
    (fake_bin / "scancel").write_text(f'#!/bin/bash\necho "scancel $*" >> {calls}\n')
    for tool in ("sbatch", "scancel"):
        (fake_bin / tool).chmod(0o755)
    if marker_appears == "before sbatch":
        open(marker, "w").close()
    files = [StagedFile(str(script), b"#!/bin/bash\n"), StagedFile(str(sidecar), b"HF_TOKEN=secret\n")]
    command, stdin = build_submit(
        build_stage(files), str(script), cancel_by_name="scancel --name=job", secret_files=[str(sidecar)]
    )
    done = _bash(command, stdin, env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"})
    assert not sidecar.exists() and script.exists()
    if marker_appears == "before sbatch":
        assert done.returncode == 5 and not calls.exists()
    else:
        assert done.returncode == 0 and calls.read_text() == "scancel --name=job\n"
