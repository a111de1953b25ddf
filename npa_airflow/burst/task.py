"""Burst specs and SkyPilot task documents (pure: no I/O beyond reading a YAML file the author names).

``BurstSpec`` is the validated form of the seed's ``npa burst submit`` arguments (named as the operators name
them: ``--gpu-per-node`` is ``accelerators``, ``--entrypoint`` is ``command``); ``build_task`` turns it
into a SkyPilot task dict whose ``run`` is the generated torchrun launcher. ``load_task_yaml`` and
``substitute_vars`` are the seed's ``submit-yaml``: exactly one task document, ``${VAR}`` placeholders
filled from ``vars``, and a refusal while any non-runtime placeholder is left.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from npa_airflow.exceptions import NpaValidationError

# The variables the launcher owns. A command or environment that sets them would fight the rendezvous.
DISTRIBUTED_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
)
# SkyPilot's registry login variables: all three together, only from an explicit Airflow connection.
DOCKER_LOGIN_VARS = ("SKYPILOT_DOCKER_SERVER", "SKYPILOT_DOCKER_USERNAME", "SKYPILOT_DOCKER_PASSWORD")
TEARDOWN_POLICIES = ("down", "keep")

_ACCELERATOR_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_.-]{0,63}):(?P<count>[1-9][0-9]{0,2})$")
# SkyPilot cluster names: a letter first, then letters, digits, '-', '_' or '.', ending alphanumeric.
_CLUSTER_RE = re.compile(r"^[a-z]([-_.a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER_RE = re.compile(r"\$\{([^}]*)\}")
_LEADING_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BASH_OPERATOR_RE = re.compile(r"(?:(?::?[-=+?]|##?|%%?).*)?", re.S)
_VAR_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SETS_DISTRIBUTED_RE = re.compile(r"(?:^|[\s;&|(])(?:export\s+)?(" + "|".join(DISTRIBUTED_VARS) + r")=")
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_PYTHON_RE = re.compile(r"^python(?:[0-9](?:\.[0-9]+)?)?$")


def _bad(field_name: str, value: Any, why: str) -> NpaValidationError:
    return NpaValidationError(f"{field_name}={value!r}: {why}")


def _stripped_match(field_name: str, value: Any, pattern: re.Pattern[str], why: str) -> str:
    """``value`` without surrounding blanks if it matches ``pattern``, else a clear error saying ``why``."""
    if not isinstance(value, str) or not pattern.fullmatch(value.strip()):
        raise _bad(field_name, value, why)
    return value.strip()


def image_id(image: str | None) -> str | None:
    """A plain image reference becomes ``docker:<image>``; an explicit ``docker:`` prefix is kept.

    ``None`` (given explicitly) runs on the nodes' own software, without a container: for Slurm sites
    without Pyxis, and for the local test stack.
    """
    if image is None:
        return None
    image = _stripped_match(
        "image",
        image,
        _IMAGE_RE,
        "give an image reference such as 'nvcr.io/nvidia/pytorch:25.01-py3' "
        "(letters, digits and . _ / : @ + - only), or None to run without a container",
    )
    return image if image.startswith("docker:") else f"docker:{image}"


def validate_accelerators(spec: str, field_name: str = "accelerators") -> str:
    advice = (
        "use a SkyPilot accelerator spec NAME:COUNT per node, e.g. 'H100:8' or 'L40S:1' "
        "(ask the cluster which names it advertises)"
    )
    return _stripped_match(field_name, spec, _ACCELERATOR_RE, advice)


def command_argv(command: str) -> list[str]:
    """Split and check the command the launcher runs under torchrun: a single-process command, not a launcher of
    its own."""
    if not isinstance(command, str) or not command.strip():
        raise _bad("command", command, "give the training command, e.g. 'python train.py --config c.yaml'")
    match = _SETS_DISTRIBUTED_RE.search(command)
    if match:
        raise _bad(
            "command",
            command,
            f"it sets {match.group(1)}; the burst launcher exports {', '.join(DISTRIBUTED_VARS[:4])} itself "
            "from SkyPilot's node environment. Remove the assignment",
        )
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise _bad("command", command, f"cannot be split into arguments ({exc}); check the quoting") from exc
    for i, token in enumerate(argv):
        base = token.rsplit("/", 1)[-1]
        is_module_launch = base in _TORCHRUN_MODULES and i > 0 and argv[i - 1] == "-m"
        if base == "torchrun" or is_module_launch:
            raise _bad(
                "command",
                command,
                "it calls torchrun itself; the burst launcher already runs the command under torchrun "
                "with --nnodes/--node-rank/--master-addr set. Pass the single-process command instead",
            )
    if argv and (argv[0] == "env" or "=" in argv[0]):
        raise _bad("command", command, "environment assignments belong in environment=, not in the command")
    return argv


def torchrun_target(argv: list[str]) -> tuple[bool, list[str]]:
    """``(no_python, args)`` for torchrun: a ``python ...`` or other command runs as-is (``--no-python``);
    a bare ``script.py ...`` is handed to torchrun, which runs it with its own interpreter."""
    if argv[0].endswith(".py") and not _PYTHON_RE.match(argv[0].rsplit("/", 1)[-1]):
        return False, argv
    return True, argv


def validate_envs(envs: Mapping[str, Any] | None, field_name: str = "environment") -> dict[str, str]:
    result: dict[str, str] = {}
    for key, value in (envs or {}).items():
        if not isinstance(key, str) or not _ENV_NAME_RE.fullmatch(key):
            raise _bad(field_name, key, "environment variable names are [A-Za-z_][A-Za-z0-9_]*")
        if key in DISTRIBUTED_VARS:
            raise _bad(field_name, key, "the burst launcher sets this from SkyPilot's node environment")
        if key in DOCKER_LOGIN_VARS:
            raise _bad(
                field_name,
                key,
                "registry credentials come only from registry_conn_id (an Airflow connection)",
            )
        if value is None or isinstance(value, (dict, list)):
            raise _bad(field_name, key, "values must be strings or numbers")
        result[key] = str(value)
    return result


def validate_job_name(name: Any, field_name: str = "name") -> str:
    if not isinstance(name, str) or not _JOB_NAME_RE.fullmatch(name):
        raise _bad(field_name, name, "use 1-128 characters from [A-Za-z0-9._-], starting with a letter or digit")
    return name


def validate_cluster_name(name: str, field_name: str = "cluster_name") -> str:
    if not isinstance(name, str) or not _CLUSTER_RE.fullmatch(name):
        raise _bad(
            field_name,
            name,
            "SkyPilot cluster names are lowercase: a letter, then [-_.a-z0-9], ending alphanumeric, <= 63 chars",
        )
    return name


@dataclass(frozen=True)
class BurstSpec:
    """One gang-scheduled torchrun job: the seed's ``npa burst submit`` arguments, validated."""

    image: str | None
    nodes: int
    accelerators: str
    command: str
    name: str
    environment: Mapping[str, str] = field(default_factory=dict)
    infra: str | None = None
    workdir: str | None = None
    file_mounts: Mapping[str, str] = field(default_factory=dict)
    master_port: int = 29500

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= 512:
            raise _bad("nodes", self.nodes, "give a whole number of nodes between 1 and 512")
        image_id(self.image)
        validate_accelerators(self.accelerators)
        command_argv(self.command)
        validate_job_name(self.name)
        validate_envs(self.environment)
        if self.infra is not None and (not isinstance(self.infra, str) or not self.infra.strip()):
            raise _bad("infra", self.infra, "give e.g. 'k8s', 'slurm/<cluster>' or 'aws/us-east-1', or None")
        if isinstance(self.master_port, bool) or not isinstance(self.master_port, int):
            raise _bad("master_port", self.master_port, "give a TCP port number")
        if not 1024 <= self.master_port <= 65535:
            raise _bad("master_port", self.master_port, "use a port between 1024 and 65535")
        for remote, local in (self.file_mounts or {}).items():
            if not isinstance(remote, str) or not isinstance(local, str) or not remote or not local:
                raise _bad("file_mounts", {remote: local}, "map a remote path to a local path or bucket URI")


def build_task(spec: BurstSpec, run: str, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The SkyPilot task dict for ``spec`` with ``run`` as its command (the rendered launcher)."""
    resources: dict[str, Any] = {"accelerators": validate_accelerators(spec.accelerators)}
    if spec.image is not None:
        resources["image_id"] = image_id(spec.image)
    if spec.infra:
        resources["infra"] = spec.infra.strip()
    task: dict[str, Any] = {
        "name": spec.name,
        "num_nodes": spec.nodes,
        "resources": resources,
        "run": run,
    }
    envs = validate_envs(spec.environment)
    if envs:
        task["envs"] = envs
    if secrets:
        task["secrets"] = dict(secrets)
    if spec.workdir:
        task["workdir"] = spec.workdir
    if spec.file_mounts:
        task["file_mounts"] = dict(spec.file_mounts)
    return task


def redacted(task: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to show (template field, log): secret values replaced."""
    shown = dict(task)
    if shown.get("secrets"):
        shown["secrets"] = dict.fromkeys(shown["secrets"], "<redacted>")
    return shown


def dag_yaml(task: Mapping[str, Any], dag_name: str | None = None) -> str:
    """The request's ``task`` string: SkyPilot's chain-DAG YAML (a name header document, then the task)."""
    name = dag_name or task.get("name")
    return yaml.safe_dump_all([{"name": name}, dict(task)], sort_keys=False)


def docker_login_secrets(server: str | None, username: str | None, password: str | None) -> dict[str, str]:
    """The three SkyPilot registry variables, together or an error naming what is missing."""
    values = dict(zip(DOCKER_LOGIN_VARS, (server, username, password), strict=True))
    missing = [k for k, v in values.items() if not v]
    if missing:
        raise NpaValidationError(
            f"registry connection is incomplete: {', '.join(missing)} empty. Set host (registry server), "
            "login and password on the connection given as registry_conn_id"
        )
    return {k: str(v) for k, v in values.items()}


# ---------------------------------------------------------------- submit-yaml


def load_task_yaml(text: str, source: str = "<yaml>") -> dict[str, Any]:
    """Exactly one SkyPilot task document; a chain-DAG name header alone before it is tolerated."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise NpaValidationError(f"{source}: not valid YAML ({exc})") from exc
    if len(docs) == 2 and isinstance(docs[0], dict) and set(docs[0]) == {"name"}:
        docs = docs[1:]
    if len(docs) != 1:
        raise NpaValidationError(
            f"{source}: holds {len(docs)} documents; burst runs exactly one task. A pipeline of several "
            "tasks is a workflow, not a burst job"
        )
    task = docs[0]
    if not isinstance(task, dict):
        raise NpaValidationError(f"{source}: the document is a {type(task).__name__}, not a SkyPilot task mapping")
    for key in ("tasks", "jobs", "pipeline"):
        if key in task:
            raise NpaValidationError(f"{source}: has '{key}:'; burst runs exactly one task, not a group of tasks")
    if not task.get("run"):
        raise NpaValidationError(f"{source}: has no 'run:' command")
    return task


def is_runtime_var(name: str) -> bool:
    """SkyPilot's own variables (``${SKYPILOT_NODE_RANK}`` ...) are left for bash at run time."""
    return name.startswith("SKYPILOT_")


def substitute_vars(task: Any, variables: Mapping[str, Any], source: str = "<yaml>") -> Any:
    """Replace ``${VAR}`` everywhere (keys and values) from ``variables``; refuse what stays unresolved."""
    for name in variables:
        if not isinstance(name, str) or not _VAR_NAME_RE.fullmatch(name):
            raise _bad("vars", name, "placeholder names are [A-Za-z_][A-Za-z0-9_]*")
    unresolved: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in variables:
            return str(variables[name])
        # ${SKYPILOT_X} and bash forms of it such as ${SKYPILOT_X:-0} stay for run time.
        leading = _LEADING_NAME_RE.match(name)
        if leading and is_runtime_var(leading.group(0)) and _BASH_OPERATOR_RE.fullmatch(name[leading.end() :]):
            return match.group(0)
        unresolved.append(name)
        return match.group(0)

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return _PLACEHOLDER_RE.sub(replace, node)
        if isinstance(node, dict):
            return {walk(k): walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result = walk(task)
    if unresolved:
        names = sorted(set(unresolved))
        raise NpaValidationError(
            f"{source}: unresolved placeholder(s) {', '.join('${' + n + '}' for n in names)}; pass them in "
            "vars={...} (only SkyPilot runtime variables such as ${SKYPILOT_NODE_RANK} may stay)"
        )
    return result
