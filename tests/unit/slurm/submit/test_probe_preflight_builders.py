"""Pure parts of the NCCL probe and the preflight: rendering, outcomes, cache, the preflight command in bash."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from npa_airflow.exceptions import NpaParseError, NpaValidationError
from npa_airflow.slurm.submit.preflight import PreflightRequest, build_preflight_command, parse_preflight
from npa_airflow.slurm.submit.probe import (
    ProbeSpec,
    cache_key,
    classify_probe_event,
    decode_cache,
    default_knob_sets,
    encode_cache,
    knobs_label,
    probe_needed,
    probe_source,
    render_probe_script,
    validate_knob_sets,
)


def _probe(**kw) -> ProbeSpec:
    values = {
        "job_name": "npa-probe-0123456789-t1",
        "partition": "gpu",
        "script_path": "/shared/npa/probe/nccl_allreduce_probe.py",
        "stdout_path": "/shared/logs/%x-%j.out",
        "stderr_path": "/shared/logs/%x-%j.out",
    }
    values.update(kw)
    return ProbeSpec(**values)


def test_default_escalation_is_the_seeds() -> None:
    assert default_knob_sets("ib0") == [
        {},
        {"NCCL_P2P_DISABLE": "1"},
        {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "ib0"},
    ]
    assert knobs_label({}) == "(none)"
    assert knobs_label({"B": "2", "A": "1"}) == "A=1,B=2"


def test_probe_gate() -> None:
    assert probe_needed(2, 1)
    assert probe_needed(1, 2)
    assert probe_needed(4, 8)
    assert not probe_needed(1, 1)
    assert not probe_needed(1, 0)


def test_render_probe_in_container_with_knobs() -> None:
    spec = _probe(
        gpus_per_node=8,
        procs_per_node=8,
        image="/shared/sqsh/pt.sqsh",
        mounts=("/shared/npa/probe:/shared/npa/probe",),
        env={"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"},
    )
    script = render_probe_script(spec)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=npa-probe-0123456789-t1",
        "#SBATCH --partition=gpu",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --ntasks=2",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --wait-all-nodes=1",
        "#SBATCH --time=4",
        "#SBATCH --output=/shared/logs/%x-%j.out",
        "#SBATCH --error=/shared/logs/%x-%j.out",
        "#SBATCH --no-requeue",
    ]
    assert "export NCCL_P2P_DISABLE=1\nexport NCCL_SOCKET_IFNAME=eth0\n" in script
    assert (
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --container-image=/shared/sqsh/pt.sqsh "
        "--container-mounts=/shared/npa/probe:/shared/npa/probe --container-workdir=/shared/npa/probe "
        "--container-env=MASTER_ADDR,MASTER_PORT,NCCL_P2P_DISABLE,NCCL_SOCKET_IFNAME \\" in script
    )
    assert "timeout --signal=TERM --kill-after=10 120 \\" in script
    assert "--nproc-per-node=8" in script


def test_render_probe_quotes_env_values() -> None:
    script = render_probe_script(_probe(env={"NCCL_SOCKET_IFNAME": "eth0; rm -rf ~"}))
    assert "export NCCL_SOCKET_IFNAME='eth0; rm -rf ~'\n" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.parametrize("srun_rc", [0, 3, 124])
def test_hostile_knob_value_runs_nothing_in_real_bash(tmp_path: Path, srun_rc: int) -> None:
    """Every line that prints the knobs (start, passed, failed, timeout) runs here with stand-ins for Slurm."""
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker})`touch {marker}`\"'; touch {marker}; '!x"
    script = render_probe_script(_probe(env={"NCCL_SOCKET_IFNAME": hostile}))
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text("#!/bin/bash\nprintf 'c1\\nc2\\n'\n")
    (fake_bin / "srun").write_text(f"#!/bin/bash\nexit {srun_rc}\n")
    for tool in fake_bin.iterdir():
        tool.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{fake_bin}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "c[1-2]",
    }
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert not marker.exists(), "a knob value ran as a command"
    label = f"knobs=NCCL_SOCKET_IFNAME={hostile}"
    start, end = done.stdout.splitlines()
    assert start == f"NPA_PROBE_START job=7 nodes=c[1-2] master=c1:20007 {label}"
    assert end == {0: f"NPA_PROBE_PASSED {label}", 3: f"NPA_PROBE_FAILED exit 3 {label}"}.get(
        srun_rc, f"NPA_PROBE_TIMEOUT after 120 s (the collective hung) {label}"
    )


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"image": "nvcr.io/nvidia/pytorch:24.01-py3"}, "inside the GPU allocation"),
        ({"nodes": 3}, "nodes=3"),
        ({"timeout_seconds": 5}, "timeout_seconds=5"),
        ({"env": {"MASTER_ADDR": "x"}}, "set by the probe itself"),
        ({"env": {"1BAD": "x"}}, "not an environment variable name"),
        ({"env": {"A": "x\ny"}}, "line break"),
        ({"mounts": ("rel:/x",)}, "absolute SRC"),
        ({"script_path": "probe.py"}, "absolute path"),
        ({"partition": "gpu;x"}, "not a partition name"),
    ],
)
def test_probe_spec_rejects_bad_input(overrides: dict, fragment: str) -> None:
    with pytest.raises(NpaValidationError, match=fragment):
        _probe(**overrides)


def test_validate_knob_sets() -> None:
    assert validate_knob_sets([{}, {"NCCL_P2P_DISABLE": 1}]) == [{}, {"NCCL_P2P_DISABLE": "1"}]
    for bad in ([], "NCCL_P2P_DISABLE=1", [{"PATH": "/x"}]):
        with pytest.raises(NpaValidationError):
            validate_knob_sets(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("event", "outcome"),
    [
        ({"status": "success"}, "ok"),
        ({"status": "failed", "exit_code": 124, "native_state": "FAILED"}, "hang"),
        ({"status": "failed", "exit_code": 0, "native_state": "TIMEOUT"}, "hang"),
        ({"status": "deadline"}, "hang"),
        ({"status": "failed", "exit_code": 1, "native_state": "FAILED", "log_tail": "ImportError"}, "error"),
        ({"status": "canceled", "native_state": "CANCELLED"}, "error"),
    ],
)
def test_classify_probe_event(event: dict, outcome: str) -> None:
    assert classify_probe_event(event) == outcome


def test_cache_round_trip_and_garbage() -> None:
    assert cache_key("slurm_default", "gpu") == "npa_nccl_env::slurm_default::gpu"
    text = encode_cache({"NCCL_P2P_DISABLE": "1"}, job_id="9", knob_index=1, probed_at="2026-01-01T00:00:00Z")
    assert decode_cache(text) == {"NCCL_P2P_DISABLE": "1"}
    assert decode_cache(encode_cache({}, job_id="1", knob_index=0, probed_at="x")) == {}
    for garbage in (None, "", "{", "[]", '{"env": {"PATH": "/x"}}', '{"env": "x"}'):
        assert decode_cache(garbage) is None


def test_probe_source_is_the_template_script() -> None:
    source = probe_source().decode()
    assert "NCCL_PROBE_OK" in source and "init_process_group" in source
    compile(source, "nccl_allreduce_probe.py", "exec")


def test_probe_script_single_process_gloo(tmp_path: Path) -> None:
    """The probe itself, for real: torchrun, one node, two gloo ranks."""
    torchrun = Path(os.environ.get("VIRTUAL_ENV", "/work/main/.venv")) / "bin" / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun not installed")
    script = tmp_path / "probe.py"
    script.write_bytes(probe_source())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = subprocess.run(
        [str(torchrun), "--nnodes=1", "--nproc-per-node=2", f"--master-port={port}", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "NCCL_PROBE_OK world_size=2 backend=gloo result=3" in result.stdout


# --- preflight ----------------------------------------------------------------------------------------------


def _req(**kw) -> PreflightRequest:
    values = {
        "writable_dirs": (("results_root", "/shared/results"),),
        "dataset_paths": ("lustre:///shared/data/train",),
        "partitions": ("gpu",),
        "time_minutes": 240,
    }
    values.update(kw)
    return PreflightRequest(**values)


_PARTITIONS = (
    "PartitionName=cpu AllowGroups=ALL Default=YES MaxTime=08:00:00 Nodes=c[1-2] State=UP\n"
    "PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=04:00:00 Nodes=g[1-2] State=UP\n"
)


def _output(**over: str) -> str:
    parts = {
        "tools": "".join(f"NPA_PF tool {t} /usr/bin/{t}\n" for t in ("sbatch", "srun", "squeue", "sacct", "scancel")),
        "pyxis": "NPA_PF pyxis yes\n",
        "enroot": "NPA_PF enroot /usr/bin/enroot\n",
        "dir": "NPA_PF dir results_root ok /shared/results\n",
        "path": "NPA_PF path ok /shared/data/train\n",
        "partitions": f"NPA_PF partitions-begin\n{_PARTITIONS}NPA_PF partitions-end\n",
        "done": "NPA_PF done\n",
    }
    parts.update(over)
    return "banner line\n" + "".join(parts.values())


def test_preflight_all_good() -> None:
    report = parse_preflight(_output(), _req())
    assert report.ok, report.failures
    assert report.partitions["gpu"].max_time_minutes == 240
    assert report.to_dict()["partitions"] == {"cpu": 480, "gpu": 240}


@pytest.mark.parametrize(
    ("over", "req", "expected"),
    [
        (
            {
                "tools": "NPA_PF tool sbatch -\n"
                + "".join(f"NPA_PF tool {t} /b/{t}\n" for t in ("srun", "squeue", "sacct", "scancel"))
            },
            {},
            "tool sbatch: not found on the login host. Fix: the Slurm client tools must be on the login user's PATH",
        ),
        ({"pyxis": "NPA_PF pyxis no\n"}, {}, "Pyxis: srun --help does not list --container-image. Fix: the generated"),
        ({"enroot": "NPA_PF enroot -\n"}, {}, "Enroot: enroot not found on the login host. Fix: the .sqsh conversion"),
        (
            {"dir": "NPA_PF dir results_root missing /shared/results\n"},
            {},
            "results_root /shared/results: does not exist. Fix: create it on shared storage",
        ),
        (
            {"dir": "NPA_PF dir results_root notwritable /shared/results\n"},
            {},
            "results_root /shared/results: is not a writable directory",
        ),
        (
            {"path": "NPA_PF path missing /shared/data/train\n"},
            {},
            "dataset lustre:///shared/data/train: does not exist (test -e on the login host). Fix: stage the data",
        ),
        ({}, {"partitions": ("gpu-big",)}, "partition gpu-big: does not exist (known: cpu, gpu)"),
        ({}, {"time_minutes": 300}, "partition gpu: MaxTime is 240 min, the job asks for 300 min. Fix: ask for"),
    ],
)
def test_preflight_failures_name_what_and_fix(over: dict, req: dict, expected: str) -> None:
    report = parse_preflight(_output(**over), _req(**req))
    assert not report.ok
    assert [str(f) for f in report.failures if str(f).startswith(expected)], [str(f) for f in report.failures]


def test_preflight_incomplete_output_is_a_parse_error() -> None:
    with pytest.raises(NpaParseError):
        parse_preflight("NPA_PF tool sbatch /usr/bin/sbatch\n", _req())


def test_preflight_rejects_bad_requests_before_anything_runs() -> None:
    with pytest.raises(NpaValidationError, match="relative"):
        _req(dataset_paths=("data/train",))
    with pytest.raises(NpaValidationError, match="file"):
        _req(dataset_paths=("file:///home/me/data",))
    with pytest.raises(NpaValidationError, match="absolute"):
        _req(writable_dirs=(("results_root", "results"),))


def test_preflight_command_in_real_bash(tmp_path: Path) -> None:
    """Run the command against a directory tree here; the tools part sees what this PATH has."""
    results = tmp_path / "results"
    results.mkdir()
    data = tmp_path / "data it's"
    data.mkdir()
    req = PreflightRequest(
        tools=("bash", "no-such-tool-xyz"),
        check_pyxis=False,
        check_enroot=False,
        writable_dirs=(("results_root", str(results)), ("sqsh_cache_dir", str(tmp_path / "absent"))),
        dataset_paths=(str(data), str(tmp_path / "missing")),
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    out = subprocess.run(["bash", "-c", build_preflight_command(req)], capture_output=True, text=True, check=True)
    report = parse_preflight(out.stdout, req)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # read-only: nothing created
    assert [f.what for f in report.failures] == [
        "tool no-such-tool-xyz",
        f"sqsh_cache_dir {tmp_path / 'absent'}",
        f"dataset {tmp_path / 'missing'}",
    ]


def test_preflight_controller_timeout_is_transient_and_says_so() -> None:
    down = "NPA_PF partitions-begin\nslurm_load_partitions error: Socket timed out on send/recv operation\n"
    report = parse_preflight(_output(partitions=down + "NPA_PF partitions-error\nNPA_PF partitions-end\n"), _req())
    assert report.only_transient
    assert str(report.failures[0]).endswith(
        "Fix: " + "slurmctld did not answer (down, restarting or overloaded); retry later or ask the cluster admin"
    )
    mixed = _output(partitions=down + "NPA_PF partitions-error\nNPA_PF partitions-end\n", pyxis="NPA_PF pyxis no\n")
    assert not parse_preflight(mixed, _req()).only_transient
    assert not parse_preflight(_output(), _req()).only_transient
