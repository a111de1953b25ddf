"""SbatchSpec: everything the sbatch templates take, validated before anything touches the cluster.

Defaults and limits follow the seed: 1 node, 4 GPUs per node, at most 8 per node (a request at the
maximum gets exclusive nodes), 16 CPUs per task, 4 h wall time, a child timeout of 95 % of it (3.8 h),
and no wall time above the partition's maximum (4 h unless the operator passes the partition's real
MaxTime). Every error names the field, the value and the fix.

Log files: Slurm does not create the directory of ``--output``/``--error``. The spec therefore carries
concrete paths, by default ``<log_dir>/<job_name>/main.out`` and ``main.err`` (the job name is unique
per try), and the operator creates ``log_dirs`` before submitting. ``%j``/``%x`` are allowed in the
file name only.

Containers: with an image, the results directory and ``inputs`` are mounted at the same path and the step
starts in ``container_workdir`` (default: the results directory); see container.py for what a step sees.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from npa_airflow.common.naming import validate_job_name
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.container import check_mountable
from npa_airflow.slurm.handle import CLUSTER_RE

DEFAULT_NODES = 1
DEFAULT_GPUS_PER_NODE = 4
DEFAULT_MAX_GPUS_PER_NODE = 8
DEFAULT_CPUS_PER_TASK = 16
DEFAULT_TIME_HOURS = 4.0
DEFAULT_MAX_TIME_HOURS = 4.0
CHILD_TIMEOUT_FRACTION = 0.95  # 3.8 h of a 4 h wall: leaves time for post commands and the marker
MASTER_PORT = 29500
MAX_NODES = 4096
# slurmctld refuses a batch script larger than SchedulerParameters=max_script_size (default 4 MB, Slurm's
# DEFAULT_BATCH_SCRIPT_LIMIT) with "Pathname of a file, directory or other parameter too long". Environment
# values are exported in the script itself, so each one, and the whole script, must fit.
MAX_SCRIPT_BYTES = 4 * 1024 * 1024

PLACEHOLDERS = ("config_path", "job_id", "results_dir")

# Names the templates set themselves; an author's environment must not shadow them.
RESERVED_ENV = frozenset(
    {
        "WORLD_SIZE",
        "NUM_GPU_PER_NODE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TAO_NODE_COUNT",
        "TAO_GPUS_PER_NODE",
        "TAO_NODE_RANK",
        "NPA_RESULTS_DIR",
        "NPA_CHILD_EXIT_CODE_FILE",
    }
)
SECRET_NAME_RE = re.compile(
    r"(?:^|_)(?:TOKEN|PASSWORD|PASSWD|PASS|SECRET|API_?KEY|ACCESS_KEY|PRIVATE_KEY|KEY|CREDENTIALS?)$", re.I
)
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PARTITION_RE = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
ACCOUNT_RE = re.compile(r"[A-Za-z0-9_.-]+")
NODE_EXPR_RE = re.compile(r"[A-Za-z0-9_.-]+(?:\[[0-9,-]+\])?[A-Za-z0-9_.-]*")
# sbatch reads #SBATCH lines itself (no shell); keep log paths to characters that need no quoting there.
LOG_PATH_RE = re.compile(r"/[A-Za-z0-9_./+@=,%-]*")
# Options the spec owns: set them through its fields, not extra_sbatch.
OWNED_SBATCH_OPTIONS = frozenset(
    {
        "nodes", "ntasks", "ntasks-per-node", "gres", "gpus", "gpus-per-node", "cpus-per-task", "time",
        "partition", "account", "output", "error", "job-name", "requeue", "no-requeue", "exclusive",
        "exclude", "wait-all-nodes", "parsable", "wrap", "array", "chdir",
    }
)  # fmt: skip
EXTRA_SBATCH_RE = re.compile(r"--([a-z][a-z0-9-]*)(?:=([A-Za-z0-9_.,:=@%+/-]+))?")
# --clusters/-M (and sbatch's alias --cluster) choose the cluster. Every later squeue, sacct and scancel of the
# job must name the same one, so it comes from the connection (extra "cluster_name"), never from extra_sbatch.
CLUSTER_OPTION_RE = re.compile(r"--clusters?(?:[=\s](?P<long>.*))?|-M(?P<short>.*)", re.S)
MOUNT_FLAG_RE = re.compile(r"[a-z]+(?:\+[a-z]+)*")
STORAGE_SCHEMES = ("lustre://", "slurm://")


def _fail(field_name: str, value: object, fix: str) -> NpaValidationError:
    return NpaValidationError(f"SbatchSpec.{field_name}={value!r}: {fix}")


def refuse_cluster_options(extra_sbatch: Iterable[object]) -> None:
    """Refuse --clusters/--cluster/-M in `extra_sbatch`, saying how to choose the cluster instead."""
    options = [o for o in extra_sbatch if isinstance(o, str)]
    for index, option in enumerate(options):
        m = CLUSTER_OPTION_RE.fullmatch(option.strip())
        if not m:
            continue
        named = (m.group("long") or m.group("short") or "").lstrip("= ").strip()
        if not named and index + 1 < len(options):
            named = options[index + 1].strip()  # ["-M", "b"]
        cluster = named if CLUSTER_RE.fullmatch(named) else "<cluster>"
        raise _fail(
            "extra_sbatch",
            option,
            "choose the cluster with the Slurm connection instead: a connection with the same login host and user "
            f'and the extra "cluster_name": "{cluster}", passed as slurm_conn_id. Then every sbatch, squeue, sacct '
            f"and scancel of the job names that cluster (-M {cluster}); from extra_sbatch only sbatch would. Remove "
            "this option (and its value) from extra_sbatch",
        )


def _check_text(field_name: str, value: object, *, allow_newlines: bool = True) -> str:
    if not isinstance(value, str):
        raise _fail(field_name, value, "must be a string")
    if "\x00" in value:
        raise _fail(field_name, value, "contains a NUL character; remove it")
    if "\r" in value:  # sbatch refuses a whole script with DOS line breaks, after it was staged
        raise _fail(field_name, value, "contains a carriage return (CR); use plain newlines")
    if not allow_newlines and ("\n" in value or "\r" in value):
        raise _fail(field_name, value, "must be a single line")
    return value


def normalize_storage_path(path: object, field_name: str = "path") -> str:
    """A cluster shared-storage path: ``lustre:///abs/path`` or ``/abs/path`` -> ``/abs/path``.

    Local paths of the Airflow machine (relative, ``file://``) and object stores (``s3://`` ...) are
    refused: a Slurm job can only read what its compute nodes see, and fetching a dataset inside the GPU
    allocation burns it (stage the data onto shared storage first).
    """
    if not isinstance(path, str) or not path.strip():
        raise NpaValidationError(f"{field_name}={path!r} must be a non-empty path on the cluster's shared storage")
    if "\x00" in path or "\n" in path or "\r" in path:
        raise NpaValidationError(f"{field_name}={path!r} contains a NUL or newline character")
    for scheme in STORAGE_SCHEMES:
        if path.startswith(scheme):
            rest = path[len(scheme) :]
            if not rest.startswith("/"):
                raise NpaValidationError(
                    f"{field_name}={path!r} names a host; write {scheme}/absolute/path (three slashes)"
                )
            return rest
    if path.startswith("file:"):
        raise NpaValidationError(
            f"{field_name}={path!r} is a file on the Airflow machine, which compute nodes cannot read: copy it "
            "to the cluster's shared storage and pass lustre:///absolute/path"
        )
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path):
        raise NpaValidationError(
            f"{field_name}={path!r}: Slurm job inputs must be on the cluster's shared filesystem, not fetched "
            "inside the GPU allocation; stage the data first and pass lustre:///absolute/path"
        )
    if not path.startswith("/"):
        raise NpaValidationError(
            f"{field_name}={path!r} is relative (local to the Airflow machine); pass an absolute shared path "
            "such as lustre:///absolute/path"
        )
    return path


_PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def find_placeholders(text: str) -> set[str]:
    """Names used as ``{name}`` (``{{``/``}}`` are escapes; ``${VAR}`` and ``{a,b}`` are plain shell)."""
    return {m.group(1) for m in _PLACEHOLDER_RE.finditer(text) if m.group(1)}


def check_placeholders(text: str, field_name: str = "text") -> None:
    unknown = sorted(find_placeholders(text) - set(PLACEHOLDERS))
    if unknown:
        # An operator's text fields are Jinja templates rendered by Airflow first: a bare "{{name}}" there is
        # a Jinja expression (undefined), so the escape must pass through Jinja untouched.
        literal, escaped = "{" + unknown[0] + "}", "{{" + unknown[0] + "}}"
        raise NpaValidationError(
            f"{field_name} uses unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; the known "
            f"ones are {', '.join('{' + n + '}' for n in PLACEHOLDERS)}. For a literal {literal}, write {escaped} "
            f"in an SbatchSpec, or {{% raw %}}{escaped}{{% endraw %}} in an operator's field (Airflow renders "
            "it with Jinja first)"
        )


def bind_placeholders(
    text: str, *, config_path: str | None = None, job_id: str | None = None, results_dir: str | None = None
) -> str:
    """Replace ``{config_path}``, ``{job_id}``, ``{results_dir}``; ``{{``/``}}`` -> ``{``/``}``.

    An unknown ``{name}``, or a known one without a value, is an error.
    """
    values = {"config_path": config_path, "job_id": job_id, "results_dir": results_dir}
    check_placeholders(text)

    def substitute(m: re.Match[str]) -> str:
        token, name = m.group(0), m.group(1)
        if name is None:
            return token[0]
        value = values[name]
        if value is None:
            raise NpaValidationError(f"placeholder {{{name}}} is used in {text!r} but no {name} value was given")
        return value

    return _PLACEHOLDER_RE.sub(substitute, text)


def split_total_gpus(total_gpus: int, max_gpus_per_node: int = DEFAULT_MAX_GPUS_PER_NODE) -> tuple[int, int]:
    """(nodes, gpus_per_node) for a total GPU count: up to the maximum on one node, else whole nodes."""
    if not isinstance(total_gpus, int) or isinstance(total_gpus, bool) or total_gpus < 1:
        raise NpaValidationError(f"total_gpus={total_gpus!r} must be an integer >= 1")
    if total_gpus <= max_gpus_per_node:
        return 1, total_gpus
    if total_gpus % max_gpus_per_node:
        lower = total_gpus - total_gpus % max_gpus_per_node
        raise NpaValidationError(
            f"total_gpus={total_gpus} does not fill whole {max_gpus_per_node}-GPU nodes: ask for {lower} or "
            f"{lower + max_gpus_per_node}, or set nodes and gpus_per_node explicitly"
        )
    return total_gpus // max_gpus_per_node, max_gpus_per_node


def _int_field(name: str, value: object, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise _fail(name, value, f"must be an integer {bound}")
    return value


def _hours_field(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _fail(name, value, "must be a positive number of hours")
    return float(value)


def _str_tuple(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise _fail(name, value, "must be a list of strings")
    return tuple(value)


@dataclass(frozen=True)
class SbatchSpec:
    job_name: str
    command: str
    log_dir: str
    results_dir: str
    partition: str | None = None
    account: str | None = None
    nodes: int = DEFAULT_NODES
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    max_gpus_per_node: int = DEFAULT_MAX_GPUS_PER_NODE
    cpus_per_task: int = DEFAULT_CPUS_PER_TASK
    time_hours: float = DEFAULT_TIME_HOURS
    timeout_hours: float | None = None  # None = 95 % of time_hours
    max_time_hours: float | None = DEFAULT_MAX_TIME_HOURS  # the partition's MaxTime; None = unlimited
    image: str | None = None  # a .sqsh path; None = no container
    container_mounts: tuple[str, ...] = ()  # the author's, on top of the job's own paths (container.py)
    container_workdir: str | None = None  # where the step starts in the container; None = results_dir
    inputs: tuple[str, ...] = ()  # shared paths the job reads: mounted into the container at the same path
    secret_env_names: tuple[str, ...] = ()  # the names the sidecar exports (their values never come here)
    environment: Mapping[str, str] = field(default_factory=dict)
    extra_sbatch: tuple[str, ...] = ()
    requeue: bool = True
    pre_commands: tuple[str, ...] = ()
    post_commands: tuple[str, ...] = ()  # after a successful primary command, on every task
    leader_post_commands: tuple[str, ...] = ()  # after a successful primary command, task 0 only
    exclude_nodes: tuple[str, ...] = ()
    env_file: str | None = None  # mode-600 sidecar with session credentials; sourced, then shredded
    stdout_path: str | None = None  # None = <log_dir>/<job_name>/main.out
    stderr_path: str | None = None  # None = <log_dir>/<job_name>/main.err
    # True once bind() ran: commands and environment are final text ("{{" already became "{").
    placeholders_bound: bool = False

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        validate_job_name(self.job_name, "SbatchSpec.job_name")
        if not _check_text("command", self.command).strip():
            raise _fail("command", self.command, "must be a non-empty shell command")
        put("log_dir", self._log_path("log_dir", normalize_storage_path(self.log_dir, "SbatchSpec.log_dir")))
        put("results_dir", normalize_storage_path(self.results_dir, "SbatchSpec.results_dir"))
        if self.partition is not None and not (
            isinstance(self.partition, str) and PARTITION_RE.fullmatch(self.partition)
        ):
            raise _fail("partition", self.partition, "must be a partition name (or comma-separated list)")
        if self.account is not None and not (isinstance(self.account, str) and ACCOUNT_RE.fullmatch(self.account)):
            raise _fail("account", self.account, "must be an account name ([A-Za-z0-9_.-])")
        self._check_resources()
        self._check_time(put)
        self._check_container(put)
        self._check_environment(put)
        self._check_commands(put)
        self._check_extra_sbatch(put)
        self._check_nodes_and_files(put)

    # -- validation pieces -------------------------------------------------------------------------------

    def _log_path(self, name: str, path: str) -> str:
        if not LOG_PATH_RE.fullmatch(path):
            raise _fail(name, path, "sbatch reads log paths unquoted: use only letters, digits and / _ . + @ = , % -")
        return path

    def _check_resources(self) -> None:
        _int_field("nodes", self.nodes, 1, MAX_NODES)
        _int_field("max_gpus_per_node", self.max_gpus_per_node, 1, 1024)
        _int_field("gpus_per_node", self.gpus_per_node, 0)
        if self.gpus_per_node > self.max_gpus_per_node:
            nodes, per_node = divmod(self.gpus_per_node, self.max_gpus_per_node)
            hint = (
                f"use nodes={nodes * self.nodes}, gpus_per_node={self.max_gpus_per_node}"
                if not per_node
                else f"use at most {self.max_gpus_per_node} per node and more nodes"
            )
            raise _fail(
                "gpus_per_node", self.gpus_per_node, f"a node has at most {self.max_gpus_per_node} GPUs: {hint}"
            )
        _int_field("cpus_per_task", self.cpus_per_task, 1, 4096)

    def _check_time(self, put: Any) -> None:
        wall = _hours_field("time_hours", self.time_hours)
        if self.max_time_hours is not None:
            limit = _hours_field("max_time_hours", self.max_time_hours)
            if wall > limit:
                where = f"partition {self.partition!r}" if self.partition else "the default partition"
                raise _fail(
                    "time_hours",
                    self.time_hours,
                    f"exceeds the {limit:g} h maximum of {where}; lower time_hours or choose a partition "
                    "whose MaxTime allows it",
                )
        if self.timeout_hours is None:
            put("timeout_hours", round(wall * CHILD_TIMEOUT_FRACTION, 6))
        elif _hours_field("timeout_hours", self.timeout_hours) >= wall:
            raise _fail(
                "timeout_hours",
                self.timeout_hours,
                f"the child timeout must be shorter than the wall time ({wall:g} h) so post commands and the "
                "success marker still run; leave it unset for 95 % of time_hours",
            )

    def _check_container(self, put: Any) -> None:
        image = self.image
        if image is not None:
            _check_text("image", image, allow_newlines=False)
            if not (image.startswith("/") or image.startswith("./")) or not image.endswith(".sqsh"):
                raise _fail(
                    "image",
                    image,
                    "must be a .sqsh file path (absolute or ./relative); a registry reference would be pulled "
                    "inside the GPU allocation: convert it first with SlurmSqshConvertOperator and pass the "
                    ".sqsh path",
                )
            if "," in image or " " in image:
                raise _fail("image", image, "must not contain commas or spaces (srun --container-image)")
        mounts = _str_tuple("container_mounts", self.container_mounts)
        for mount in mounts:
            _check_text("container_mounts", mount, allow_newlines=False)
            parts = mount.split(":")
            ok = (
                len(parts) in (1, 2, 3)
                and all(p.startswith("/") and "," not in p and " " not in p for p in parts[:2])
                and (len(parts) < 3 or bool(MOUNT_FLAG_RE.fullmatch(parts[2])))
            )
            if not ok:
                raise _fail(
                    "container_mounts",
                    mount,
                    "each mount is /source[:/target[:flags]] with absolute paths, no commas or spaces",
                )
        if mounts and image is None:
            raise _fail("container_mounts", list(mounts), "container mounts need an image; set image or drop them")
        put("container_mounts", mounts)
        inputs = tuple(
            dict.fromkeys(
                normalize_storage_path(p, f"SbatchSpec.inputs[{i}]")
                for i, p in enumerate(_str_tuple("inputs", self.inputs))
            )
        )
        put("inputs", inputs)
        workdir = self.container_workdir
        if workdir is not None:
            if image is None:
                raise _fail("container_workdir", workdir, "a container working directory needs an image")
            if not _check_text("container_workdir", workdir, allow_newlines=False).startswith("/"):
                raise _fail("container_workdir", workdir, "must be an absolute path inside the container")
        if image is not None:  # the job's own paths are mounted into the container at the same place
            check_mountable(self.results_dir, "SbatchSpec.results_dir")
            for index, path in enumerate(inputs):
                check_mountable(path, f"SbatchSpec.inputs[{index}]")

    def _check_environment(self, put: Any) -> None:
        if not isinstance(self.environment, Mapping):
            raise _fail("environment", self.environment, "must be a mapping of NAME -> value")
        env: dict[str, str] = {}
        for name in sorted(self.environment):
            value = self.environment[name]
            if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
                raise _fail("environment", name, "variable names must match [A-Za-z_][A-Za-z0-9_]*")
            if name in RESERVED_ENV:
                raise _fail("environment", name, "is set by the sbatch template itself; do not set it")
            if SECRET_NAME_RE.search(name):
                raise _fail(
                    "environment",
                    name,
                    "looks like a credential; secrets must not appear in the script: pass them through the "
                    "sidecar env file (env_file / secret environment of the operator)",
                )
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise _fail("environment", {name: value}, "values must be strings (or numbers)")
            env[name] = _check_text(f"environment[{name!r}]", str(value))
            size = len(env[name].encode("utf-8"))
            if size > MAX_SCRIPT_BYTES:
                raise _fail(
                    "environment",
                    f"{name}=<{size} bytes>",
                    f"is {size} bytes; it is exported in the batch script, which Slurm refuses above "
                    f"{MAX_SCRIPT_BYTES} bytes (max_script_size, 4 MB by default): stage the data as a file on "
                    "shared storage and pass its path instead",
                )
            if not self.placeholders_bound:
                check_placeholders(env[name], f"SbatchSpec.environment[{name!r}]")
        put("environment", env)
        secret_names = _str_tuple("secret_env_names", self.secret_env_names)
        for name in secret_names:
            if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name) or name in RESERVED_ENV:
                raise _fail("secret_env_names", name, "must be variable names the template does not set itself")
        put("secret_env_names", tuple(dict.fromkeys(secret_names)))

    def _check_commands(self, put: Any) -> None:
        if not isinstance(self.placeholders_bound, bool):
            raise _fail("placeholders_bound", self.placeholders_bound, "must be True or False")
        bound = self.placeholders_bound
        if not bound:
            check_placeholders(self.command, "SbatchSpec.command")
        for name in ("pre_commands", "post_commands", "leader_post_commands"):
            commands = _str_tuple(name, getattr(self, name))
            for command in commands:
                if not _check_text(name, command).strip():
                    raise _fail(name, command, "empty command; remove it")
                if not bound:
                    check_placeholders(command, f"SbatchSpec.{name}")
            put(name, commands)

    def _check_extra_sbatch(self, put: Any) -> None:
        options = _str_tuple("extra_sbatch", self.extra_sbatch)
        refuse_cluster_options(options)
        for option in options:
            _check_text("extra_sbatch", option, allow_newlines=False)
            m = EXTRA_SBATCH_RE.fullmatch(option)
            if not m:
                raise _fail(
                    "extra_sbatch", option, "each entry is one long option like '--qos=high' (no spaces or quotes)"
                )
            if m.group(1) in OWNED_SBATCH_OPTIONS:
                raise _fail("extra_sbatch", option, f"--{m.group(1)} is set from the spec's own fields; use those")
        put("extra_sbatch", options)
        if not isinstance(self.requeue, bool):
            raise _fail("requeue", self.requeue, "must be True or False")

    def _check_nodes_and_files(self, put: Any) -> None:
        excludes = _str_tuple("exclude_nodes", self.exclude_nodes)
        for node in excludes:
            if not isinstance(node, str) or not NODE_EXPR_RE.fullmatch(node):
                raise _fail("exclude_nodes", node, "must be node names or hostlist expressions like g[1-2]")
        put("exclude_nodes", tuple(dict.fromkeys(excludes)))
        if self.env_file is not None:
            put("env_file", normalize_storage_path(self.env_file, "SbatchSpec.env_file"))
        for name, default in (("stdout_path", "main.out"), ("stderr_path", "main.err")):
            value = getattr(self, name)
            if value is None:
                value = f"{self.log_dir.rstrip('/')}/{self.job_name}/{default}"
            value = self._log_path(name, normalize_storage_path(value, f"SbatchSpec.{name}"))
            if "%" in posixpath.dirname(value):
                raise _fail(name, value, "Slurm does not create log directories: use %j/%x in the file name only")
            if value.endswith("/"):
                raise _fail(name, value, "must name a file, not a directory")
            put(name, value)

    # -- derived values ----------------------------------------------------------------------------------

    @property
    def exclusive(self) -> bool:
        """At or above the per-node maximum the job takes whole nodes."""
        return self.gpus_per_node > 0 and self.gpus_per_node >= self.max_gpus_per_node

    @property
    def multinode(self) -> bool:
        return self.nodes > 1

    @property
    def time_minutes(self) -> int:
        return math.ceil(self.time_hours * 60)

    @property
    def timeout_seconds(self) -> int:
        assert self.timeout_hours is not None  # set in __post_init__
        return math.floor(self.timeout_hours * 3600)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def log_dirs(self) -> tuple[str, ...]:
        """Directories the operator must create before sbatch (Slurm will not)."""
        assert self.stdout_path is not None and self.stderr_path is not None
        return tuple(dict.fromkeys(posixpath.dirname(p) for p in (self.stdout_path, self.stderr_path)))

    def log_paths_for(self, job_id: str) -> tuple[str, str]:
        """Concrete (stdout, stderr) paths of a submitted job: ``%j``, ``%x`` and ``%%`` expanded."""
        assert self.stdout_path is not None and self.stderr_path is not None

        def expand(path: str) -> str:
            return re.sub(r"%(%|j|x)", lambda m: {"%": "%", "j": job_id, "x": self.job_name}[m.group(1)], path)

        return expand(self.stdout_path), expand(self.stderr_path)

    def unbound_placeholders(self) -> set[str]:
        if self.placeholders_bound:
            return set()
        texts = [self.command, *self.pre_commands, *self.post_commands, *self.leader_post_commands]
        texts.extend(self.environment.values())
        return set().union(*(find_placeholders(t) for t in texts))

    def bind(self, **values: str | None) -> SbatchSpec:
        """A copy with ``{config_path}``, ``{job_id}``, ``{results_dir}`` bound in commands and environment.

        ``{{``/``}}`` become literal braces. A placeholder in use without a value is an error. Binding twice
        is refused (the first bind already turned escapes into plain braces).
        """
        if self.placeholders_bound:
            raise NpaValidationError(f"SbatchSpec for {self.job_name!r} is already bound; bind() once")
        unknown = sorted(set(values) - set(PLACEHOLDERS))
        if unknown:
            raise NpaValidationError(f"bind() got unknown placeholder value(s) {unknown}; known: {list(PLACEHOLDERS)}")

        def b(text: str) -> str:
            return bind_placeholders(text, **values)

        return replace(
            self,
            command=b(self.command),
            pre_commands=tuple(b(c) for c in self.pre_commands),
            post_commands=tuple(b(c) for c in self.post_commands),
            leader_post_commands=tuple(b(c) for c in self.leader_post_commands),
            environment={k: b(v) for k, v in self.environment.items()},
            placeholders_bound=True,
        )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
