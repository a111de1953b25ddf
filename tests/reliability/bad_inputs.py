"""The bad-input table: each case is an operator (or sensor) given one wrong value, run as a task would run it.

A case is data: where the value goes, what it is, the error class expected and the words its message must
contain (the field, the value, the fix). ``test_reliability_bad_inputs.py`` runs them and renders the table
in ``docs/reliability.md`` from this list and the messages actually raised, so the doc cannot drift.

Local cases point their connections at endpoints where nothing listens (SSH 127.0.0.1:1, SkyPilot
http://127.0.0.1:1) and count every connection attempt: a case passes only if validation stopped it before
any attempt. Cluster cases need the real cluster for a read-only check (partition table, ``test -e``) and
prove that no job with the task's name exists and no file was written.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from npa_airflow.exceptions import NpaHostKeyError, NpaValidationError

SLURM_UNREACHABLE = "slurm_unreachable"
SKYPILOT_UNREACHABLE = "skypilot_unreachable"
REGISTRY_INCOMPLETE = "registry_incomplete"
DAG_ID = "npa_bad_inputs"
# Set by the test module: a run id unique to the session, a scratch results root on the cluster (cluster
# cases), the path of a dataset that does not exist, and a private directory for YAML files.
SESSION: dict[str, str] = {
    "run_id": "manual__bad-inputs",
    "results_root": "/nonexistent/results",
    "missing_input": "/nonexistent/dataset",
    "yaml_dir": "/nonexistent",
}


@dataclass(frozen=True)
class Case:
    id: str
    surface: str  # operator and argument the value goes to
    shown: str  # the input as the doc shows it
    run: Callable[[], Any]
    words: tuple[str, ...]  # the message must contain each (field, value, fix)
    error: type[Exception] = NpaValidationError
    cluster: bool = False  # needs the real cluster for a read-only check
    kwargs: dict[str, Any] = field(default_factory=dict)


def job_name(task_id: str = "train", try_number: int = 1) -> str:
    from tests.harness.airflow_tasks import job_name as job_name_for

    return job_name_for(DAG_ID, task_id, SESSION["run_id"], -1, try_number)


def context(task_id: str = "train", try_number: int = 1) -> dict[str, Any]:
    pushed: dict[str, Any] = {}
    ti = types.SimpleNamespace(
        dag_id=DAG_ID, task_id=task_id, run_id=SESSION["run_id"], map_index=-1, try_number=try_number, pushed=pushed
    )
    ti.xcom_push = lambda key, value: pushed.__setitem__(key, value)
    return {"ti": ti}


def slurm_task(conn_id: str = SLURM_UNREACHABLE, task_id: str = "train", **overrides: Any) -> Any:
    """Build a SlurmSubmitOperator (parse time), render its fields and execute it (run time)."""
    from npa_airflow.slurm.operators import SlurmSubmitOperator

    kwargs: dict[str, Any] = dict(
        task_id=task_id, slurm_conn_id=conn_id, command="echo ok", partition="cpu", gpus_per_node=0,
        cpus_per_task=1, time_hours=0.1, poll_interval=2, deferrable=True,
    )  # fmt: skip
    if conn_id == "slurm_default":
        kwargs["results_root"] = SESSION["results_root"]
    kwargs.update(overrides)
    op = SlurmSubmitOperator(**kwargs)
    ctx = context(task_id)
    op.render_template_fields(ctx)
    return op.execute(ctx)


def burst_task(**overrides: Any) -> Any:
    from npa_airflow.burst.operators import BurstTorchrunOperator

    kwargs: dict[str, Any] = dict(
        task_id="burst", skypilot_conn_id=SKYPILOT_UNREACHABLE, image="nvcr.io/nvidia/pytorch:25.01-py3", nodes=2,
        accelerators="H100:8", command="python train.py --config configs/run.yaml", name="bad-input-case",
    )  # fmt: skip
    kwargs.update(overrides)
    op = BurstTorchrunOperator(**kwargs)
    ctx = context("burst")
    op.render_template_fields(ctx)
    return op.execute(ctx)


def yaml_task(text: str, tmp_dir: str, **overrides: Any) -> Any:
    from pathlib import Path

    from npa_airflow.burst.operators import BurstSubmitYamlOperator

    path = Path(tmp_dir) / "task.yaml"
    path.write_text(text)
    kwargs: dict[str, Any] = dict(task_id="yaml", skypilot_conn_id=SKYPILOT_UNREACHABLE, yaml_path=str(path))
    kwargs.update(overrides)
    op = BurstSubmitYamlOperator(**kwargs)
    ctx = context("yaml")
    op.render_template_fields(ctx)
    return op.execute(ctx)


def convert_task(image: str) -> Any:
    from npa_airflow.slurm.operators import SlurmSqshConvertOperator

    op = SlurmSqshConvertOperator(task_id="convert", slurm_conn_id=SLURM_UNREACHABLE, image=image)
    ctx = context("convert")
    op.render_template_fields(ctx)
    return op.execute(ctx)


def sensor_task(job: Any) -> Any:
    from npa_airflow.slurm.sensors import SlurmJobSensor

    op = SlurmJobSensor(task_id="wait", slurm_conn_id=SLURM_UNREACHABLE, job=job)
    ctx = context("wait")
    op.render_template_fields(ctx)
    return op.execute(ctx)


def preflight_task(**overrides: Any) -> Any:
    from npa_airflow.slurm.operators import SlurmPreflightOperator

    op = SlurmPreflightOperator(task_id="preflight", slurm_conn_id=SLURM_UNREACHABLE, **overrides)
    ctx = context("preflight")
    op.render_template_fields(ctx)
    return op.execute(ctx)


def _yaml(text: str, **kw: Any) -> Callable[[], Any]:
    return lambda: yaml_task(text, SESSION["yaml_dir"], **kw)


S = "SlurmSubmitOperator"
B = "BurstTorchrunOperator"
Y = "BurstSubmitYamlOperator"
GOOD_YAML_RUN = "run: python train.py\n"

CASES: list[Case] = [
    # -- resources -----------------------------------------------------------------------------------------
    Case("nodes-zero", f"{S}(nodes=)", "0", lambda: slurm_task(nodes=0), ("nodes=0", "between 1 and")),
    Case("nodes-negative", f"{S}(nodes=)", "-2", lambda: slurm_task(nodes=-2), ("nodes=-2", "between 1 and")),
    Case("gpus-too-many", f"{S}(gpus_per_node=)", "9 (a node has 8)", lambda: slurm_task(gpus_per_node=9),
         ("gpus_per_node=9", "at most 8 GPUs")),
    Case("gpus-negative", f"{S}(gpus_per_node=)", "-1", lambda: slurm_task(gpus_per_node=-1),
         ("gpus_per_node=-1", ">= 0")),
    Case("cpus-zero", f"{S}(cpus_per_task=)", "0", lambda: slurm_task(cpus_per_task=0), ("cpus_per_task=0",)),
    Case("time-zero", f"{S}(time_hours=)", "0", lambda: slurm_task(time_hours=0), ("time_hours=0", "positive")),
    Case("timeout-not-below-wall", f"{S}(timeout_hours=)", "1.0 with time_hours=1.0",
         lambda: slurm_task(time_hours=1.0, timeout_hours=1.0), ("timeout_hours=1.0", "shorter than the wall time")),
    Case("wall-above-partition-max", f"{S}(time_hours=, partition=)", "5 h on partition gpu (MaxTime 4 h)",
         lambda: slurm_task(conn_id="slurm_default", partition="gpu", time_hours=5), ("300 min", "'gpu'", "240 min",
         "lower time_hours"), cluster=True),
    Case("partition-unknown", f"{S}(partition=)", "nosuch", lambda: slurm_task(conn_id="slurm_default",
         partition="nosuch"), ("'nosuch'", "does not exist", "known partitions: cpu, gpu"), cluster=True),
    Case("partition-metachar", f"{S}(partition=)", "gpu;reboot", lambda: slurm_task(partition="gpu;reboot"),
         ("partition='gpu;reboot'", "partition name")),
    Case("account-space", f"{S}(account=)", "my account", lambda: slurm_task(account="my account"),
         ("account='my account'", "[A-Za-z0-9_.-]")),
    # -- command and environment ---------------------------------------------------------------------------
    Case("command-empty", f"{S}(command=)", "''", lambda: slurm_task(command=""), ("command=''", "non-empty")),
    Case("command-blank", f"{S}(command=)", "'   '", lambda: slurm_task(command="   "), ("command='   '",)),
    Case("command-unknown-placeholder", f"{S}(command=)", "python train.py --data {data_dir}",
         lambda: slurm_task(command="python train.py --data {data_dir}"), ("{data_dir}", "{results_dir}", "{{")),
    Case("env-reserved", f"{S}(environment=)", "{'MASTER_ADDR': '10.0.0.1'}",
         lambda: slurm_task(environment={"MASTER_ADDR": "10.0.0.1"}), ("MASTER_ADDR", "set by the sbatch template")),
    Case("env-secret-in-script", f"{S}(environment=)", "{'HF_TOKEN': 'hf_...'}",
         lambda: slurm_task(environment={"HF_TOKEN": "hf_" + "x" * 34}), ("HF_TOKEN", "sidecar")),
    Case("env-bad-name", f"{S}(environment=)", "{'BAD-NAME': '1'}", lambda: slurm_task(environment={"BAD-NAME": "1"}),
         ("BAD-NAME", "[A-Za-z_][A-Za-z0-9_]*")),
    Case("env-nul", f"{S}(environment=)", "{'X': 'a\\x00b'}", lambda: slurm_task(environment={"X": "a\x00b"}),
         ("NUL",)),
    Case("secret-env-literal", f"{S}(secret_env=)", "{'HF_TOKEN': 'hf_literal'}",
         lambda: slurm_task(secret_env={"HF_TOKEN": "hf_literal"}), ("secret_env['HF_TOKEN']", "var:", "conn:")),
    Case("extra-sbatch-owned", f"{S}(extra_sbatch=)", "['--partition=gpu']",
         lambda: slurm_task(extra_sbatch=["--partition=gpu"]), ("--partition", "spec's own fields")),
    Case("extra-sbatch-injection", f"{S}(extra_sbatch=)", "['--qos=high; rm -rf ~']",
         lambda: slurm_task(extra_sbatch=["--qos=high; rm -rf ~"]), ("--qos=high; rm -rf ~", "one long option")),
    Case("exclude-metachar", f"{S}(exclude_nodes=)", "['c1;id']", lambda: slurm_task(exclude_nodes=["c1;id"]),
         ("c1;id", "node names")),
    # -- images and mounts ---------------------------------------------------------------------------------
    Case("image-registry-uri", f"{S}(image=)", "nvcr.io#nvidia/pytorch:24.01-py3",
         lambda: slurm_task(image="nvcr.io#nvidia/pytorch:24.01-py3"), ("nvcr.io#nvidia/pytorch:24.01-py3", ".sqsh",
         "SlurmSqshConvertOperator")),
    Case("image-docker-uri", f"{S}(image=)", "docker://nvcr.io#nvidia/pytorch:24.01-py3",
         lambda: slurm_task(image="docker://nvcr.io#nvidia/pytorch:24.01-py3"), ("docker://", ".sqsh")),
    Case("image-relative-name", f"{S}(image=)", "images/train.sqsh", lambda: slurm_task(image="images/train.sqsh"),
         ("images/train.sqsh", "absolute or ./relative")),
    Case("mount-relative", f"{S}(container_mounts=)", "['data:/data'] with an image",
         lambda: slurm_task(image="/sqsh/x.sqsh", container_mounts=["data:/data"]), ("data:/data", "absolute")),
    Case("mount-without-image", f"{S}(container_mounts=)", "['/data:/data'] without an image",
         lambda: slurm_task(container_mounts=["/data:/data"]), ("container mounts need an image",)),
    Case("convert-bad-ref", "SlurmSqshConvertOperator(image=)", "'nvcr.io/nvidia/pytorch:24.01 ; id'",
         lambda: convert_task("nvcr.io/nvidia/pytorch:24.01 ; id"), ("nvcr.io/nvidia/pytorch:24.01 ; id",)),
    # -- paths and storage ---------------------------------------------------------------------------------
    Case("input-relative", f"{S}(inputs=)", "data/train", lambda: slurm_task(inputs=["data/train"]),
         ("data/train", "relative", "lustre:///")),
    Case("input-file-uri", f"{S}(inputs=)", "file:///home/me/train", lambda: slurm_task(inputs=["file:///home/me/train"]),
         ("file:///home/me/train", "Airflow machine", "lustre:///")),
    Case("input-s3", f"{S}(inputs=)", "s3://bucket/train", lambda: slurm_task(inputs=["s3://bucket/train"]),
         ("s3://bucket/train", "stage the data first")),
    Case("input-lustre-host", f"{S}(inputs=)", "lustre://fs1/data", lambda: slurm_task(inputs=["lustre://fs1/data"]),
         ("lustre://fs1/data", "three slashes")),
    Case("input-missing", f"{S}(inputs=)", "$NPA_CLUSTER_DIR/shared/data/no-such-dataset (absent)",
         lambda: slurm_task(conn_id="slurm_default", inputs=[SESSION["missing_input"]]),
         ("no-such-dataset", "test -e", "nothing was written or submitted"), cluster=True),
    Case("results-root-relative", f"{S}(results_root=)", "results", lambda: slurm_task(results_root="results"),
         ("results_root='results'", "relative")),
    Case("log-dir-space", f"{S}(log_dir=)", "/shared/my logs", lambda: slurm_task(log_dir="/shared/my logs"),
         ("/shared/my logs", "unquoted")),
    Case("preflight-dataset-relative", "SlurmPreflightOperator(dataset_paths=)", "data/train",
         lambda: preflight_task(dataset_paths=["data/train"], containers=False), ("data/train",)),
    # -- operator options and references -------------------------------------------------------------------
    Case("previous-try-policy", f"{S}(on_previous_try=)", "ignore", lambda: slurm_task(on_previous_try="ignore"),
         ("on_previous_try='ignore'", "reattach", "cancel")),
    Case("poll-interval-zero", f"{S}(poll_interval=)", "0", lambda: slurm_task(poll_interval=0),
         ("poll_interval=0", "positive")),
    Case("checkpoint-signal-no-seconds", f"{S}(checkpoint_signal=)", "'USR1'",
         lambda: slurm_task(checkpoint_signal="USR1"), ("checkpoint_signal='USR1'", "<SIGNAL>@<seconds>", "USR1@900")),
    Case("checkpoint-signal-kill", f"{S}(checkpoint_signal=)", "'KILL@60'",
         lambda: slurm_task(checkpoint_signal="KILL@60"), ("KILL is not a signal to checkpoint on", "USR1, USR2")),
    Case("checkpoint-signal-after-timeout", f"{S}(checkpoint_signal=)", "'USR1@300' with time_hours=4",
         lambda: slurm_task(time_hours=4, checkpoint_signal="USR1@300"), ("child timeout", "720 s", "USR1@780")),
    Case("extra-sbatch-signal", f"{S}(extra_sbatch=)", "['--signal=B:USR1@300']",
         lambda: slurm_task(extra_sbatch=["--signal=B:USR1@300"]), ("--signal=B:USR1@300", "checkpoint_signal")),
    Case("max-segments-zero", f"{S}(max_segments=)", "0",
         lambda: slurm_task(max_segments=0), ("max_segments=0", "between 1 and 1000")),
    Case("max-preemptions-negative", f"{S}(max_preemptions=)", "-1",
         lambda: slurm_task(max_preemptions=-1), ("max_preemptions=-1", "between 0 and 100")),
    Case("open-mode-in-extra-sbatch", f"{S}(extra_sbatch=)", "['--open-mode=truncate']",
         lambda: slurm_task(extra_sbatch=["--open-mode=truncate"]), ("--open-mode=append", "requeue=True")),
    Case("max-wait-negative", f"{S}(max_wait=)", "-1 min", lambda: slurm_task(max_wait=timedelta(minutes=-1)),
         ("max_wait=", "positive")),
    Case("sensor-job-injection", "SlurmJobSensor(job=)", "'123; scancel -u npa'",
         lambda: sensor_task("123; scancel -u npa"), ("123; scancel -u npa", "job id")),
    Case("host-key-missing", "slurm connection (no known_hosts, verification on)", "extra without known_hosts",
         lambda: slurm_task(conn_id="slurm_no_host_key"), ("no known_hosts or host_key", "ssh-keyscan",
         "insecure_skip_host_key_check")),
    Case("host-key-changed", f"{S} on a connection whose known_hosts has another key", "changed host key",
         lambda: slurm_task(conn_id="slurm_wrong_host_key"), ("not trusted", "known_hosts"), error=NpaHostKeyError,
         cluster=True),
    # -- burst ---------------------------------------------------------------------------------------------
    Case("burst-nodes-zero", f"{B}(nodes=)", "0", lambda: burst_task(nodes=0), ("nodes=0", "between 1 and 512")),
    Case("burst-gpu-no-count", f"{B}(accelerators=)", "H100", lambda: burst_task(accelerators="H100"),
         ("accelerators='H100'", "NAME:COUNT")),
    Case("burst-gpu-zero", f"{B}(accelerators=)", "H100:0", lambda: burst_task(accelerators="H100:0"),
         ("accelerators='H100:0'", "NAME:COUNT")),
    Case("burst-command-torchrun", f"{B}(command=)", "torchrun --nproc-per-node 8 train.py",
         lambda: burst_task(command="torchrun --nproc-per-node 8 train.py"), ("calls torchrun itself",)),
    Case("burst-command-module-launch", f"{B}(command=)", "python -m torch.distributed.run train.py",
         lambda: burst_task(command="python -m torch.distributed.run train.py"), ("calls torchrun itself",)),
    Case("burst-command-master-addr", f"{B}(command=)", "MASTER_ADDR=10.0.0.1 python train.py",
         lambda: burst_task(command="MASTER_ADDR=10.0.0.1 python train.py"), ("sets MASTER_ADDR",
         "Remove the assignment")),
    Case("burst-command-rank", f"{B}(command=)", "export RANK=0; python train.py",
         lambda: burst_task(command="export RANK=0; python train.py"), ("sets RANK",)),
    Case("burst-command-empty", f"{B}(command=)", "''", lambda: burst_task(command=""),
         ("command=''", "training command")),
    Case("burst-env-world-size", f"{B}(environment=)", "{'WORLD_SIZE': '16'}",
         lambda: burst_task(environment={"WORLD_SIZE": "16"}),
         ("WORLD_SIZE", "launcher sets this")),
    Case("burst-env-registry-password", f"{B}(environment=)", "{'SKYPILOT_DOCKER_PASSWORD': '...'}",
         lambda: burst_task(environment={"SKYPILOT_DOCKER_PASSWORD": "pw"}),
         ("SKYPILOT_DOCKER_PASSWORD", "registry_conn_id")),
    Case("burst-name-metachar", f"{B}(name=)", "train; rm -rf ~", lambda: burst_task(name="train; rm -rf ~"),
         ("name='train; rm -rf ~'", "[A-Za-z0-9._-]")),
    Case("burst-name-newline", f"{B}(name=)", "'train\\nid'", lambda: burst_task(name="train\nid"),
         ("name='train\\nid'",)),
    Case("burst-image-metachar", f"{B}(image=)", "'nvcr.io/x:1 $(id)'", lambda: burst_task(image="nvcr.io/x:1 $(id)"),
         ("image='nvcr.io/x:1 $(id)'", "image reference")),
    Case("burst-cluster-name", f"{B}(cluster_name=)", "Train_Cluster!",
         lambda: burst_task(cluster_name="Train_Cluster!"),
         ("cluster_name='Train_Cluster!'", "lowercase")),
    Case("burst-teardown", f"{B}(teardown=)", "destroy", lambda: burst_task(teardown="destroy"),
         ("teardown='destroy'", "down", "keep")),
    Case("burst-registry-incomplete", f"{B}(registry_conn_id=)", "connection without a password",
         lambda: burst_task(registry_conn_id=REGISTRY_INCOMPLETE), ("SKYPILOT_DOCKER_PASSWORD", "registry_conn_id")),
    Case("yaml-unresolved-var", f"{Y}(vars=)", "run: ${ENTRY} with vars={}", _yaml("name: t\nrun: ${ENTRY}\n"),
         ("${ENTRY}", "vars=")),
    Case("yaml-multi-document", f"{Y}(yaml_path=)", "two task documents",
         _yaml("name: a\nrun: echo a\n---\nname: b\nrun: echo b\n"), ("2 documents", "exactly one task")),
    Case("yaml-task-group", f"{Y}(yaml_path=)", "a document with 'tasks:'",
         _yaml("name: g\nrun: echo\ntasks:\n  - run: echo a\n  - run: echo b\n"), ("'tasks:'", "exactly one task")),
    Case("yaml-no-run", f"{Y}(yaml_path=)", "a task without run:", _yaml("name: t\nresources: {}\n"),
         ("no 'run:'",)),
    Case("yaml-registry-in-envs", f"{Y}(yaml_path=)", "envs: {SKYPILOT_DOCKER_PASSWORD: ...}",
         _yaml("name: t\n" + GOOD_YAML_RUN + "envs:\n  SKYPILOT_DOCKER_PASSWORD: pw\n"),
         ("SKYPILOT_DOCKER_PASSWORD", "registry_conn_id")),
    # -- the cluster of a Slurm job comes from the connection (appended: earlier rows keep their numbers) -------
    Case("extra-sbatch-clusters", f"{S}(extra_sbatch=)", "['--clusters=b']",
         lambda: slurm_task(extra_sbatch=["--clusters=b"]), ("--clusters=b", '"cluster_name": "b"', "slurm_conn_id")),
    Case("extra-sbatch-M", f"{S}(extra_sbatch=)", "['-M', 'b']",
         lambda: slurm_task(extra_sbatch=["-M", "b"]), ("'-M'", '"cluster_name": "b"', "slurm_conn_id")),
    # -- what a container sees --------------------------------------------------------------------------------
    Case("input-unmountable", f"{S}(inputs=)", "['/shared/data,v2'] with an image",
         lambda: slurm_task(image="/sqsh/x.sqsh", inputs=["/shared/data,v2"]),
         ("/shared/data,v2", "cannot be mounted into the container", "','")),
    Case("workdir-relative", f"{S}(container_workdir=)", "work with an image",
         lambda: slurm_task(image="/sqsh/x.sqsh", container_workdir="work"), ("'work'", "absolute path inside")),
]  # fmt: skip
