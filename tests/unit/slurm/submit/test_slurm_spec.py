"""SbatchSpec: seed defaults and limits, and a clear error for every kind of bad input."""

from __future__ import annotations

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.placeholders import bind_placeholders, find_placeholders
from npa_airflow.slurm.submit.spec import SbatchSpec
from npa_airflow.slurm.submit.spec_fields import split_total_gpus
from npa_airflow.slurm.submit.storage_paths import normalize_storage_path

BASE = {
    "job_name": "npa-train-0123456789-t1",
    "command": "python train.py --config {config_path}",
    "log_dir": "/shared/logs",
    "results_dir": "/shared/results/run1",
}


def spec(**overrides):
    return SbatchSpec(**{**BASE, **overrides})


def test_seed_defaults():
    s = spec()
    assert (s.nodes, s.gpus_per_node, s.max_gpus_per_node, s.cpus_per_task) == (1, 4, 8, 16)
    assert (s.time_hours, s.timeout_hours, s.max_time_hours) == (4.0, 3.8, 4.0)
    assert (s.time_minutes, s.timeout_seconds) == (240, 13680)
    assert s.requeue is True
    assert s.image is None
    assert not s.exclusive and not s.multinode
    assert s.stdout_path == "/shared/logs/npa-train-0123456789-t1/main.out"
    assert s.stderr_path == "/shared/logs/npa-train-0123456789-t1/main.err"
    assert s.log_dirs == ("/shared/logs/npa-train-0123456789-t1",)


def test_exclusive_at_or_above_the_per_node_maximum():
    assert spec(gpus_per_node=8).exclusive
    assert not spec(gpus_per_node=7).exclusive
    assert not spec(gpus_per_node=0).exclusive  # CPU partitions
    assert spec(gpus_per_node=4, max_gpus_per_node=4).exclusive


def test_gpus_above_the_node_maximum_suggest_whole_nodes():
    with pytest.raises(NpaValidationError, match=r"gpus_per_node=16.*nodes=2, gpus_per_node=8"):
        spec(gpus_per_node=16)


def test_split_total_gpus():
    assert split_total_gpus(4) == (1, 4)
    assert split_total_gpus(8) == (1, 8)
    assert split_total_gpus(32) == (4, 8)
    with pytest.raises(NpaValidationError, match="ask for 8 or 16"):
        split_total_gpus(12)


def test_time_limits():
    assert spec(time_hours=2).timeout_hours == pytest.approx(1.9)
    assert spec(time_hours=10, max_time_hours=None).time_minutes == 600
    assert spec(time_hours=0.5, timeout_hours=0.25).timeout_seconds == 900
    with pytest.raises(NpaValidationError, match=r"time_hours=6.*4 h maximum of partition 'polar'"):
        spec(time_hours=6, partition="polar")
    assert spec(time_hours=6, partition="long", max_time_hours=24).time_hours == 6
    with pytest.raises(NpaValidationError, match="timeout_hours=4"):
        spec(timeout_hours=4)
    for bad in (0, -1, float("inf"), "4", True):
        with pytest.raises(NpaValidationError, match="time_hours"):
            spec(time_hours=bad)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"job_name": "bad name"}, "job_name"),
        ({"job_name": "a;b"}, "job_name"),
        ({"command": "   "}, "command"),
        ({"command": "a\x00b"}, "command"),
        ({"nodes": 0}, "nodes"),
        ({"nodes": 1.5}, "nodes"),
        ({"gpus_per_node": -1}, "gpus_per_node"),
        ({"cpus_per_task": 0}, "cpus_per_task"),
        ({"partition": "gpu; rm"}, "partition"),
        ({"account": "a b"}, "account"),
        ({"log_dir": "logs"}, "log_dir"),
        ({"log_dir": "/logs with space"}, "log_dir"),
        ({"results_dir": "s3://bucket/x"}, "results_dir"),
        ({"results_dir": "/a\nb"}, "results_dir"),
        ({"environment": {"1BAD": "x"}}, "environment"),
        ({"environment": {"A-B": "x"}}, "environment"),
        ({"environment": {"HF_TOKEN": "x"}}, "environment"),
        ({"environment": {"DB_PASSWORD": "x"}}, "environment"),
        ({"environment": {"AWS_SECRET_ACCESS_KEY": "x"}}, "environment"),
        ({"environment": {"WORLD_SIZE": "3"}}, "environment"),
        ({"environment": {"A": ["list"]}}, "environment"),
        ({"extra_sbatch": ("--qos=high\n#SBATCH --x",)}, "extra_sbatch"),
        ({"extra_sbatch": ("--comment=a b",)}, "extra_sbatch"),
        ({"extra_sbatch": ("-q high",)}, "extra_sbatch"),
        ({"extra_sbatch": ("--time=10",)}, "extra_sbatch"),
        ({"extra_sbatch": "--qos=high"}, "extra_sbatch"),
        ({"pre_commands": ("",)}, "pre_commands"),
        ({"exclude_nodes": ("g1;x",)}, "exclude_nodes"),
        ({"env_file": "relative.env"}, "env_file"),
        ({"stdout_path": "/logs/%j/main.out"}, "stdout_path"),
        ({"requeue": "yes"}, "requeue"),
    ],
)
def test_bad_input_names_the_field(overrides, field):
    with pytest.raises(NpaValidationError, match=field):
        spec(**overrides)


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt",
        "docker://nvcr.io#nvidia/pytorch:24.01",
        "nvcr.io#nvidia/pytorch:24.01",
        "/images/pytorch.tar",
        "images/pytorch.sqsh",
    ],
)
def test_registry_image_is_refused_with_the_fix(image):
    with pytest.raises(NpaValidationError, match="SlurmSqshConvertOperator"):
        spec(image=image)


def test_sqsh_image_and_mounts():
    s = spec(image="/shared/sqsh/pytorch.sqsh", container_mounts=["/shared/data:/data:ro", "/shared/results:/results"])
    assert s.container_mounts == ("/shared/data:/data:ro", "/shared/results:/results")
    assert spec(image="./pytorch.sqsh").image == "./pytorch.sqsh"
    for bad in ("data:/data", "/a,b:/data", "/a:/b:ro:x", "/a:/b:RO;rm"):
        with pytest.raises(NpaValidationError, match="container_mounts"):
            spec(image="/x.sqsh", container_mounts=[bad])
    with pytest.raises(NpaValidationError, match="need an image"):
        spec(container_mounts=["/a:/b"])
    assert spec(image="/x.sqsh", container_mounts=["/shared/code"]).container_mounts == ("/shared/code",)


def test_container_paths_and_workdir():
    s = spec(
        image="/x.sqsh", inputs=["lustre:///shared/data", "/shared/data", "/shared/cfg.yaml"], container_workdir="/w"
    )
    assert s.inputs == ("/shared/data", "/shared/cfg.yaml") and s.container_workdir == "/w"
    with pytest.raises(NpaValidationError, match=r"container_workdir.*needs an image"):
        spec(container_workdir="/w")
    with pytest.raises(NpaValidationError, match=r"container_workdir.*absolute path inside the container"):
        spec(image="/x.sqsh", container_workdir="w")
    with pytest.raises(NpaValidationError, match="relative"):
        spec(inputs=["data"])
    # Without an image any path works; with one, the job's own paths must be mountable by Pyxis.
    assert spec(results_dir="/shared/a,b", inputs=["/in:put"]).inputs == ("/in:put",)
    with pytest.raises(NpaValidationError, match=r"results_dir='/shared/a,b' cannot be mounted"):
        spec(image="/x.sqsh", results_dir="/shared/a,b")
    with pytest.raises(NpaValidationError, match=r"inputs\[0\]='/in put' cannot be mounted"):
        spec(image="/x.sqsh", inputs=["/in put"])


def test_secret_env_names():
    assert spec(secret_env_names=["HF_TOKEN", "HF_TOKEN", "WANDB_API_KEY"]).secret_env_names == (
        "HF_TOKEN",
        "WANDB_API_KEY",
    )
    for bad in ("1X", "MASTER_ADDR", "A-B"):
        with pytest.raises(NpaValidationError, match="secret_env_names"):
            spec(secret_env_names=[bad])


def test_environment_is_sorted_and_stringified():
    s = spec(environment={"B": 2, "A": "it's $(x)"})
    assert list(s.environment.items()) == [("A", "it's $(x)"), ("B", "2")]


def test_lustre_paths_are_normalised_everywhere():
    s = spec(log_dir="lustre:///lustre/logs", results_dir="lustre:///lustre/results", env_file="lustre:///l/.env")
    assert (s.log_dir, s.results_dir, s.env_file) == ("/lustre/logs", "/lustre/results", "/l/.env")


@pytest.mark.parametrize(
    ("path", "expected"),
    [("lustre:///lustre/data/coco", "/lustre/data/coco"), ("/lustre/data", "/lustre/data"), ("slurm:///a", "/a")],
)
def test_normalize_storage_path_accepts(path, expected):
    assert normalize_storage_path(path) == expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("data/coco", "relative"),
        ("./data", "relative"),
        ("file:///home/me/data", "Airflow machine"),
        ("s3://bucket/coco", "shared filesystem"),
        ("https://example.org/x.tar", "shared filesystem"),
        ("lustre://host/data", "three slashes"),
        ("", "non-empty"),
        ("/a\nb", "newline"),
    ],
)
def test_normalize_storage_path_rejects(path, message):
    with pytest.raises(NpaValidationError, match=message):
        normalize_storage_path(path, "dataset")


def test_log_paths_with_patterns_in_the_file_name():
    s = spec(stdout_path="/shared/logs/x/%x-%j.out", stderr_path="/shared/logs/x/%j-100%%.err")
    assert s.log_paths_for("77") == ("/shared/logs/x/npa-train-0123456789-t1-77.out", "/shared/logs/x/77-100%.err")
    assert s.log_dirs == ("/shared/logs/x",)


# --------------------------------------------------------------------------------------------- placeholders


def test_bind_placeholders():
    text = "run --cfg {config_path} --out {results_dir}/{job_id} ${HOME} {a,b} {{literal}} awk '{print $1}'"
    assert find_placeholders(text) == {"config_path", "results_dir", "job_id"}
    assert (
        bind_placeholders(text, config_path="/c.yaml", job_id="J1", results_dir="/r")
        == "run --cfg /c.yaml --out /r/J1 ${HOME} {a,b} {literal} awk '{print $1}'"
    )


def test_bind_placeholders_errors():
    with pytest.raises(NpaValidationError, match=r"unknown placeholder\(s\) \{dataset\}"):
        bind_placeholders("x {dataset}")
    with pytest.raises(NpaValidationError, match="no job_id value"):
        bind_placeholders("x {job_id}", config_path="/c")


def test_unknown_placeholder_in_spec_fails_at_construction():
    with pytest.raises(NpaValidationError, match=r"SbatchSpec.post_commands.*\{outdir\}"):
        spec(post_commands=["cp x {outdir}"])
    with pytest.raises(NpaValidationError, match=r"environment\['CFG'\]"):
        spec(environment={"CFG": "{cfg}"})


def test_spec_bind():
    s = spec(
        pre_commands=["mkdir -p {results_dir}/ckpt"],
        leader_post_commands=["echo {job_id} > {results_dir}/done"],
        environment={"CFG": "{config_path}", "LIT": "{{x}}"},
    )
    assert s.unbound_placeholders() == {"config_path", "results_dir", "job_id"}
    b = s.bind(config_path="/r/spec.yaml", job_id="npa-1", results_dir="/r")
    assert b.command == "python train.py --config /r/spec.yaml"
    assert b.pre_commands == ("mkdir -p /r/ckpt",)
    assert b.leader_post_commands == ("echo npa-1 > /r/done",)
    assert b.environment == {"CFG": "/r/spec.yaml", "LIT": "{x}"}
    assert b.placeholders_bound and b.unbound_placeholders() == set()
    with pytest.raises(NpaValidationError, match="already bound"):
        b.bind(job_id="x")
    with pytest.raises(NpaValidationError, match="unknown placeholder value"):
        s.bind(dataset="/d")


def test_an_environment_value_over_slurms_script_limit_is_refused_by_name():
    from npa_airflow.slurm.submit.spec_fields import MAX_SCRIPT_BYTES

    with pytest.raises(NpaValidationError, match=r"BIG_BLOB.*4194304 bytes.*max_script_size"):
        SbatchSpec(
            job_name="npa-x-t1",
            command="true",
            log_dir="/l",
            results_dir="/r",
            environment={"SMALL": "1", "BIG_BLOB": "x" * (5 * 1024 * 1024)},
        )
    SbatchSpec(job_name="npa-x-t1", command="true", log_dir="/l", results_dir="/r", environment={"OK": "x" * 1000})
    assert MAX_SCRIPT_BYTES == 4 * 1024 * 1024


def test_a_rendered_script_over_the_limit_is_refused_before_staging():
    from npa_airflow.slurm.submit.scripts import check_script_size

    check_script_size("#!/bin/bash\n" + "x" * 100)
    with pytest.raises(NpaValidationError, match=r"4194304 bytes.*nothing was written"):
        check_script_size("#!/bin/bash\n" + "x" * (4 * 1024 * 1024))
