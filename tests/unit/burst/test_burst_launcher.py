"""The generated torchrun launcher: rendering, and real runs of it (two nodes on loopback, real torchrun)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from npa_airflow.burst.launcher import render_launcher
from npa_airflow.burst.task import BurstSpec

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent


def spec(**overrides):
    args = dict(
        image="nvcr.io/nvidia/pytorch:25.01-py3",
        nodes=2,
        accelerators="H100:8",
        command="python allreduce_probe.py",
        name="demo",
    )
    args.update(overrides)
    return BurstSpec(**args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rendered_launcher_is_valid_bash_and_quotes_every_argument():
    script = render_launcher(spec(command="python train.py --name 'a b' --glob '*.yaml' --x '$(id)'"))
    assert subprocess.run(["bash", "-n"], input=script.encode()).returncode == 0
    assert "  --no-python \\\n  python \\\n  train.py \\\n  --name \\\n  'a b' \\\n  --glob \\\n  '*.yaml'" in script
    assert "'$(id)'" in script
    assert "MASTER_PORT=29500" in script


def test_bare_script_command_lets_torchrun_pick_the_interpreter():
    script = render_launcher(spec(command="train.py --epochs 1"))
    assert "--no-python" not in script
    assert "  train.py \\\n  --epochs \\\n  1\n" in script


def node_env(rank: int, path: str, port_nodes: int = 2) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(
        PATH=path,
        SKYPILOT_NODE_RANK=str(rank),
        SKYPILOT_NODE_IPS="127.0.0.1\n127.0.0.1",
        SKYPILOT_NUM_NODES=str(port_nodes),
        SKYPILOT_NUM_GPUS_PER_NODE="1",
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.mark.skipif(not (VENV_BIN / "torchrun").exists(), reason="torch (torchrun) is not installed in this venv")
def test_two_nodes_complete_a_gloo_all_reduce_under_the_launcher(tmp_path):
    shutil.copy(HERE / "allreduce_probe.py", tmp_path)
    script = render_launcher(spec(master_port=free_port()))
    path = f"{VENV_BIN}:/usr/bin:/bin"
    nodes = [
        subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=node_env(rank, path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for node in nodes:
            out, _ = node.communicate(timeout=120)
            outputs.append(out)
    finally:
        for node in nodes:
            node.kill()
    for node, out in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, out
    joined = "\n".join(outputs)
    # Two nodes x one process each: global ranks 0 and 1 both see 1 + 2.
    assert "allreduce rank=0 world=2 sum=3 expected=3 master=127.0.0.1:" in joined
    assert "allreduce rank=1 world=2 sum=3 expected=3 master=127.0.0.1:" in joined
    assert "npa-burst: node 0/2, master 127.0.0.1:" in outputs[0]
    assert "npa-burst: node 1/2, master 127.0.0.1:" in outputs[1]


def test_missing_torchrun_fails_with_an_explicit_message(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "head", "tr", "printf"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    result = subprocess.run(
        ["bash", "-c", render_launcher(spec())],
        cwd=tmp_path,
        env=node_env(0, str(bare)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 127
    assert "npa-burst: torchrun not found on PATH in image nvcr.io/nvidia/pytorch:25.01-py3 (node rank 0)" in (
        result.stderr
    )


def test_launcher_outside_skypilot_says_so(tmp_path):
    env = node_env(0, f"{VENV_BIN}:/usr/bin:/bin")
    del env["SKYPILOT_NODE_IPS"]
    result = subprocess.run(
        ["bash", "-c", render_launcher(spec())], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "SKYPILOT_NODE_IPS is not set" in result.stderr


def test_torchrun_arguments_and_rendezvous_from_a_long_node_list(tmp_path):
    """A stand-in torchrun (prints what it was given) checks the exec line; 5000 node IPs must not break it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text('#!/bin/bash\necho "ARGS $*"\necho "ENV $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $RANK"\n')
    fake.chmod(0o755)
    env = node_env(3, f"{bin_dir}:/usr/bin:/bin")
    env["SKYPILOT_NODE_IPS"] = " 10.0.0.7 \n" + "\n".join(f"10.0.{i // 250}.{i % 250}" for i in range(5000))
    env["SKYPILOT_NUM_NODES"] = "5001"
    env["SKYPILOT_NUM_GPUS_PER_NODE"] = "8"
    result = subprocess.run(
        ["bash", "-c", render_launcher(spec(master_port=29511))], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert (
        "ARGS --nnodes=5001 --node-rank=3 --nproc-per-node=8 --master-addr=10.0.0.7 --master-port=29511 "
        "--no-python python allreduce_probe.py"
    ) in result.stdout
    assert "ENV 10.0.0.7 29511 5001 3" in result.stdout
