"""BurstSpec validation, task building and the submit-yaml rules (pure)."""

from __future__ import annotations

import pytest
import yaml

from npa_airflow.burst.task import (
    BurstSpec,
    build_task,
    command_argv,
    dag_yaml,
    docker_login_secrets,
    image_id,
    load_task_yaml,
    redacted,
    substitute_vars,
    torchrun_target,
)
from npa_airflow.exceptions import NpaValidationError


def spec(**overrides):
    args = dict(
        image="nvcr.io/nvidia/pytorch:25.01-py3",
        nodes=2,
        accelerators="H100:8",
        command="python train.py --config configs/run.yaml",
        name="demo",
    )
    args.update(overrides)
    return BurstSpec(**args)


def test_plain_image_becomes_docker_and_explicit_prefix_is_kept():
    assert image_id("ghcr.io/org/img:1") == "docker:ghcr.io/org/img:1"
    assert image_id("docker:ghcr.io/org/img:1") == "docker:ghcr.io/org/img:1"


@pytest.mark.parametrize("image", ["", "a b", "img;rm -rf /", "$(id)", 42])
def test_bad_image_is_rejected_naming_the_field(image):
    with pytest.raises(NpaValidationError, match="image="):
        spec(image=image)


@pytest.mark.parametrize("gpus", ["H100", "H100:0", "H100:x", ":8", "H100:8:1", 8])
def test_bad_accelerator_spec_is_rejected(gpus):
    with pytest.raises(NpaValidationError, match=r"accelerators=.*NAME:COUNT"):
        spec(accelerators=gpus)


@pytest.mark.parametrize("nodes", [0, -1, True, "2", 513])
def test_bad_node_count_is_rejected(nodes):
    with pytest.raises(NpaValidationError, match="nodes="):
        spec(nodes=nodes)


@pytest.mark.parametrize(
    "command, why",
    [
        ("torchrun --nproc-per-node 8 train.py", "calls torchrun"),
        ("/opt/conda/bin/torchrun train.py", "calls torchrun"),
        ("python -m torch.distributed.run train.py", "calls torchrun"),
        ("python -m torch.distributed.launch train.py", "calls torchrun"),
        ("MASTER_ADDR=10.0.0.1 python train.py", "sets MASTER_ADDR"),
        ("export WORLD_SIZE=16; python train.py", "sets WORLD_SIZE"),
        ("env RANK=0 python train.py", "sets RANK"),
        ("FOO=1 python train.py", "environment assignments belong in environment="),
        ("python 'unterminated", "check the quoting"),
        ("   ", "give the training command"),
    ],
)
def test_commands_that_fight_the_launcher_are_rejected(command, why):
    with pytest.raises(NpaValidationError, match=why):
        command_argv(command)


def test_command_mentioning_rank_in_an_argument_is_fine():
    assert command_argv("python train.py --rank-file ranks.txt --world-size-hint 4")[0] == "python"


def test_python_commands_run_as_is_and_bare_scripts_go_to_torchrun():
    assert torchrun_target(["python", "-m", "pkg.train"]) == (True, ["python", "-m", "pkg.train"])
    assert torchrun_target(["python3.11", "t.py"]) == (True, ["python3.11", "t.py"])
    assert torchrun_target(["train.py", "--x"]) == (False, ["train.py", "--x"])
    assert torchrun_target(["bash", "run.sh"]) == (True, ["bash", "run.sh"])


@pytest.mark.parametrize("key", ["MASTER_PORT", "RANK", "SKYPILOT_DOCKER_PASSWORD", "1BAD"])
def test_environment_may_not_set_launcher_or_registry_variables(key):
    with pytest.raises(NpaValidationError, match=f"environment='{key}'"):
        spec(environment={key: "x"})


def test_build_task_shape():
    task = build_task(
        spec(environment={"HF_HOME": "/data/hf"}, infra="slurm/local"), run="echo hi", secrets={"HF_TOKEN": "s3cr3t"}
    )
    assert task == {
        "name": "demo",
        "num_nodes": 2,
        "resources": {
            "image_id": "docker:nvcr.io/nvidia/pytorch:25.01-py3",
            "accelerators": "H100:8",
            "infra": "slurm/local",
        },
        "run": "echo hi",
        "envs": {"HF_HOME": "/data/hf"},
        "secrets": {"HF_TOKEN": "s3cr3t"},
    }
    assert redacted(task)["secrets"] == {"HF_TOKEN": "<redacted>"}
    assert task["secrets"] == {"HF_TOKEN": "s3cr3t"}  # redaction copies


def test_dag_yaml_is_a_name_header_then_the_task():
    docs = list(yaml.safe_load_all(dag_yaml({"name": "demo", "run": "echo hi"})))
    assert docs == [{"name": "demo"}, {"name": "demo", "run": "echo hi"}]


def test_docker_login_needs_all_three_values():
    assert docker_login_secrets("ghcr.io", "me", "pw") == {
        "SKYPILOT_DOCKER_SERVER": "ghcr.io",
        "SKYPILOT_DOCKER_USERNAME": "me",
        "SKYPILOT_DOCKER_PASSWORD": "pw",
    }
    with pytest.raises(NpaValidationError, match="SKYPILOT_DOCKER_PASSWORD empty") as info:
        docker_login_secrets("ghcr.io", "me", "")
    assert "me" not in str(info.value).replace("name", "")


# ---------------------------------------------------------------- submit-yaml

TASK_YAML = """
name: smoke-${NPA_RUN_ID}
num_nodes: 2
envs:
  OUTPUT_URI: ${NPA_OUTPUT_URI}
run: |
  echo rank ${SKYPILOT_NODE_RANK} of ${SKYPILOT_NUM_NODES} -> ${NPA_OUTPUT_URI}
"""


def test_substitution_fills_every_placeholder_and_keeps_runtime_vars():
    task = substitute_vars(load_task_yaml(TASK_YAML), {"NPA_RUN_ID": "r1", "NPA_OUTPUT_URI": "s3://b/p/r1/"})
    assert task["name"] == "smoke-r1"
    assert task["envs"] == {"OUTPUT_URI": "s3://b/p/r1/"}
    assert task["run"] == "echo rank ${SKYPILOT_NODE_RANK} of ${SKYPILOT_NUM_NODES} -> s3://b/p/r1/\n"


def test_unresolved_placeholder_is_refused_with_its_name():
    with pytest.raises(NpaValidationError, match=r"unresolved placeholder\(s\) \$\{NPA_OUTPUT_URI\}"):
        substitute_vars(load_task_yaml(TASK_YAML), {"NPA_RUN_ID": "r1"})


def test_placeholder_in_a_key_is_substituted_too():
    task = substitute_vars({"file_mounts": {"/data/${RUN}": "s3://b/${RUN}"}, "run": "x"}, {"RUN": "r9"})
    assert task["file_mounts"] == {"/data/r9": "s3://b/r9"}


def test_malformed_placeholder_is_refused():
    with pytest.raises(NpaValidationError, match=r"\$\{bad name\}"):
        substitute_vars({"run": "echo ${bad name}"}, {})


@pytest.mark.parametrize(
    "text, why",
    [
        ("run: a\n---\nrun: b\n", "holds 2 documents"),
        ("name: pipe\n---\nrun: a\n---\nrun: b\n", "holds 3 documents"),
        ("name: g\ntasks:\n  - run: a\n", "'tasks:'"),
        ("- run: a\n", "not a SkyPilot task mapping"),
        ("name: x\n", "no 'run:'"),
        ("run: [\n", "not valid YAML"),
        ("", "holds 0 documents"),
    ],
)
def test_load_task_yaml_accepts_exactly_one_task(text, why):
    with pytest.raises(NpaValidationError, match=why):
        load_task_yaml(text)


def test_name_header_before_the_task_is_tolerated():
    assert load_task_yaml("name: pipe\n---\nrun: a\n") == {"run": "a"}


def test_image_none_runs_without_a_container():
    task = build_task(spec(image=None), run="echo hi")
    assert "image_id" not in task["resources"]
    assert image_id(None) is None


def test_bash_forms_of_runtime_variables_stay_but_not_of_others():
    task = {"run": "echo ${SKYPILOT_NUM_GPUS_PER_NODE:-0} ${SKYPILOT_NODE_IPS%%x} ${SKYPILOT_TASK_ID}"}
    assert substitute_vars(task, {}) == task
    with pytest.raises(NpaValidationError, match=r"\$\{HOME:-/root\}"):
        substitute_vars({"run": "echo ${HOME:-/root}"}, {})
    with pytest.raises(NpaValidationError, match=r"\$\{SKYPILOT_X Y\}"):
        substitute_vars({"run": "echo ${SKYPILOT_X Y}"}, {})
