"""The offsets and claim files next to a job's stdout: the shell that writes and reads them, run in real bash."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from npa_airflow.common.ownership import Claim
from npa_airflow.slurm.commands.offsets import (
    build_commit_offsets,
    build_read_claims,
    build_read_offsets,
    build_write_claims,
    parse_read_claims,
    parse_read_offsets,
)


def test_offsets_builders_round_trip_in_real_bash(tmp_path):
    paths = [str(tmp_path / "a.npa-offsets"), str(tmp_path / "it's $(weird).npa-offsets")]
    payloads = [json.dumps({"/x/a.out": 5}), json.dumps({"/x/$(b).out": 9, "/x/b.err": 0})]
    subprocess.run(["bash", "-c", build_commit_offsets(list(zip(paths, payloads, strict=True)))], check=True)
    missing = str(tmp_path / "missing")
    out = subprocess.run(["bash", "-c", build_read_offsets([*paths, missing])], capture_output=True, check=True)
    parsed = parse_read_offsets(out.stdout, [*paths, missing])
    assert parsed == {paths[0]: {"/x/a.out": 5}, paths[1]: {"/x/$(b).out": 9, "/x/b.err": 0}, missing: {}}
    assert not list(tmp_path.glob("*.tmp"))


def test_claims_round_trip_and_guard_the_offsets_in_real_bash(tmp_path):
    """A superseded trigger's offsets write is refused by the shell itself; claims read back as written."""
    claim_file, offsets = str(tmp_path / "it's $(x).npa-owner-abc"), str(tmp_path / "o.npa-offsets")
    mine, theirs = Claim.new(1), Claim.new(1)
    subprocess.run(["bash", "-c", build_write_claims([(claim_file, mine)])], check=True)
    missing = str(tmp_path / "missing")
    out = subprocess.run(["bash", "-c", build_read_claims([claim_file, missing])], capture_output=True, check=True)
    assert parse_read_claims(out.stdout.split(b"\n", 1)[0], [claim_file, missing]) == {claim_file: mine, missing: None}
    guard = {offsets: (claim_file, mine)}
    subprocess.run(["bash", "-c", build_commit_offsets([(offsets, '{"a": 5}')], guard)], check=True)
    assert json.loads(Path(offsets).read_text()) == {"a": 5}
    subprocess.run(["bash", "-c", build_write_claims([(claim_file, theirs)])], check=True)  # another trigger
    subprocess.run(["bash", "-c", build_commit_offsets([(offsets, '{"a": 3}')], guard)], check=True)
    assert json.loads(Path(offsets).read_text()) == {"a": 5}, "a superseded trigger wound the offsets back"
    assert not list(tmp_path.glob("*.tmp"))


def test_parse_read_offsets_ignores_damaged_files():
    assert parse_read_offsets(b'not json\0[1]\0{"/a": -3, "/b": 2}\0', ["x", "y", "z"]) == {
        "x": {},
        "y": {},
        "z": {"/b": 2},
    }
