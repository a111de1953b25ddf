"""The read-only checks before a submission, batched into one round trip: built, run in real bash, parsed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from npa_airflow.exceptions import NpaRemoteError
from npa_airflow.slurm import commands
from npa_airflow.slurm.images import SqshStatus
from npa_airflow.slurm.ssh import CommandResult
from npa_airflow.slurm.submit_checks import Layout, build_submit_checks, parse_submit_checks

PARTITIONS = "PartitionName=cpu Default=YES MaxTime=02:00:00 State=UP Nodes=c[1-2] TotalNodes=2\n"
NODES = "NodeName=c1 State=IDLE Partitions=cpu CfgTRES=cpu=8,mem=4096M RealMemory=4096\n"


def result(stdout: str, rc: int = 0) -> CommandResult:
    return CommandResult(stdout=stdout.encode(), stderr=b"boom", returncode=rc, host="login1")


def test_the_batch_holds_only_what_is_asked_in_a_fixed_order() -> None:
    assert build_submit_checks([], None, Layout.NONE) == []
    both = build_submit_checks(["/data/a"], "/sqsh/x.sqsh", Layout.NODES, "b")
    assert both[0] == commands.build_partitions("b") and both[1] == commands.build_scontrol_nodes("b")
    assert "/data/a" in both[2] and both[3].endswith("npa_sqsh_check /sqsh/x.sqsh || true")
    assert len(build_submit_checks([], "/sqsh/x.sqsh", Layout.PARTITIONS)) == 2


def test_answers_are_read_in_the_same_order() -> None:
    checks = parse_submit_checks(
        [result(PARTITIONS), result(NODES), result("NPA_MISSING /data/b\n", 3), result("NPA_SQSH VALID 8192 8000\n")],
        ["/data/a", "/data/b"],
        "/sqsh/x.sqsh",
        Layout.NODES,
    )
    assert checks.exists == {"/data/a": True, "/data/b": False}
    assert checks.image is not None and checks.image.valid and checks.image.path == "/sqsh/x.sqsh"
    assert checks.partitions is not None and checks.partitions["cpu"].max_time_minutes == 120
    assert checks.nodes is not None and "c1" in checks.nodes
    only_image = parse_submit_checks([result("NPA_SQSH MISSING\n")], [], "/sqsh/y.sqsh", Layout.NONE)
    assert only_image.image is not None and only_image.image.status is SqshStatus.MISSING
    assert only_image.partitions is None and only_image.exists == {}


def test_a_failed_read_is_an_error_not_an_answer() -> None:
    with pytest.raises(NpaRemoteError, match="scontrol show partitions failed on login1"):
        parse_submit_checks([result("", 1)], [], None, Layout.PARTITIONS)
    with pytest.raises(NpaRemoteError, match="checking paths on login1 failed"):
        parse_submit_checks([result("", 2)], ["/data/a"], None, Layout.NONE)


@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="squashfs-tools not installed")
def test_the_batch_runs_in_real_bash(tmp_path: Path) -> None:
    (tmp_path / "root" / "dev").mkdir(parents=True)
    image = tmp_path / "image.sqsh"
    subprocess.run(
        ["mksquashfs", str(tmp_path / "root"), str(image), "-quiet", "-noappend", "-p", "dev/null c 666 0 0 1 3"],
        check=True,
        capture_output=True,
    )
    paths = [str(tmp_path / "root"), str(tmp_path / "absent")]
    argvs = build_submit_checks(paths, str(image), Layout.NONE)
    out = subprocess.run(["bash", "-c", commands.build_batch(argvs)], capture_output=True, check=True)
    frames = commands.parse_batch(out.stdout, len(argvs))
    answers = [CommandResult(stdout=o, stderr=e, returncode=rc, host="local") for rc, o, e in frames]
    checks = parse_submit_checks(answers, paths, str(image), Layout.NONE)
    assert checks.exists == {paths[0]: True, paths[1]: False}
    assert checks.image is not None
    assert (checks.image.status, checks.image.devices) == (SqshStatus.DEVICES, ("/dev/null",))
