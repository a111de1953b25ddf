"""SbatchSpec: everything the sbatch templates take, validated before anything touches the cluster.

Defaults and limits follow the seed (spec_fields.py): 1 node, 4 GPUs per node, at most 8 per node (a request
at the maximum gets exclusive nodes), 16 CPUs per task, 4 h wall time, a child timeout of 95 % of it (3.8 h),
and no wall time above the partition's maximum (4 h unless the operator passes the partition's real
MaxTime). Every error names the field, the value and the fix.

Log files: Slurm does not create the directory of ``--output``/``--error``. The spec therefore carries
concrete paths, by default ``<log_dir>/<job_name>/main.out`` and ``main.err`` (the job name is unique
per try), and the operator creates ``log_dirs`` before submitting. ``%j``/``%x`` are allowed in the
file name only.

Checkpoint warning: ``checkpoint_signal='USR1@300'`` becomes ``#SBATCH --signal=USR1@300`` (no ``B:``: Slurm signals
the step's tasks); each task passes it on to the command's processes, which see ``NPA_CHECKPOINT_SIGNAL`` and
``NPA_CHECKPOINT_SECONDS``. The warning must come before the child timeout stops the command.

Containers: with an image, the results directory and ``inputs`` are mounted at the same path and the step
starts in ``container_workdir`` (default: the results directory); see container.py for what a step sees.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from npa_airflow.common.naming import validate_job_name
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.container import check_mountable
from npa_airflow.slurm.submit.placeholders import PLACEHOLDERS, bind_placeholders, check_placeholders, find_placeholders
from npa_airflow.slurm.submit.spec_fields import (
    ACCOUNT_RE,
    DEFAULT_CPUS_PER_TASK,
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_MAX_GPUS_PER_NODE,
    DEFAULT_MAX_TIME_HOURS,
    DEFAULT_NODES,
    DEFAULT_TIME_HOURS,
    ENV_NAME_RE,
    EXTRA_SBATCH_RE,
    LOG_PATH_RE,
    MAX_SCRIPT_BYTES,
    MOUNT_FLAG_RE,
    NODE_EXPR_RE,
    OWNED_SBATCH_OPTIONS,
    PARTITION_RE,
    RESERVED_ENV,
    SECRET_NAME_RE,
    CheckpointSignal,
    check_checkpoint_signal,
    check_flag,
    check_max_segments,
    check_resources,
    check_text,
    child_timeout_hours,
    child_timeout_seconds,
    int_field,
    invalid,
    refuse_cluster_options,
    str_tuple,
    wall_seconds,
)
from npa_airflow.slurm.submit.storage_paths import normalize_storage_path


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
    checkpoint_signal: str | None = None  # 'USR1@300': the command is signalled 300 s before the limit
    max_segments: int = 1  # > 1: a long run continued over Slurm jobs (NPA_CONTINUE_FILE); see operators/segments.py
    segment: int = 1  # which of them this job is
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
        if not check_text("command", self.command).strip():
            raise invalid("command", self.command, "must be a non-empty shell command")
        put("log_dir", self._log_path("log_dir", normalize_storage_path(self.log_dir, "SbatchSpec.log_dir")))
        put("results_dir", normalize_storage_path(self.results_dir, "SbatchSpec.results_dir"))
        if self.partition is not None and not (
            isinstance(self.partition, str) and PARTITION_RE.fullmatch(self.partition)
        ):
            raise invalid("partition", self.partition, "must be a partition name (or comma-separated list)")
        if self.account is not None and not (isinstance(self.account, str) and ACCOUNT_RE.fullmatch(self.account)):
            raise invalid("account", self.account, "must be an account name ([A-Za-z0-9_.-])")
        check_resources(self.nodes, self.gpus_per_node, self.max_gpus_per_node, self.cpus_per_task)
        put(
            "timeout_hours",
            child_timeout_hours(self.time_hours, self.timeout_hours, self.max_time_hours, self.partition),
        )
        checkpoint = check_checkpoint_signal(self.checkpoint_signal, self.time_hours, self.timeout_hours)
        put("checkpoint_signal", None if checkpoint is None else str(checkpoint))  # normalised: 'USR1@300'
        check_max_segments(self.max_segments)
        int_field("segment", self.segment, 1)
        self._check_container(put)
        self._check_environment(put)
        self._check_commands(put)
        self._check_extra_sbatch(put)
        self._check_nodes_and_files(put)

    # -- validation pieces -------------------------------------------------------------------------------

    def _log_path(self, name: str, path: str) -> str:
        if not LOG_PATH_RE.fullmatch(path):
            raise invalid(name, path, "sbatch reads log paths unquoted: use only letters, digits and / _ . + @ = , % -")
        return path

    def _check_container(self, put: Any) -> None:
        image = self.image
        if image is not None:
            check_text("image", image, allow_newlines=False)
            if not (image.startswith("/") or image.startswith("./")) or not image.endswith(".sqsh"):
                raise invalid(
                    "image",
                    image,
                    "must be a .sqsh file path (absolute or ./relative); a registry reference would be pulled "
                    "inside the GPU allocation: convert it first with SlurmSqshConvertOperator and pass the "
                    ".sqsh path",
                )
            if "," in image or " " in image:
                raise invalid("image", image, "must not contain commas or spaces (srun --container-image)")
        mounts = str_tuple("container_mounts", self.container_mounts)
        for mount in mounts:
            check_text("container_mounts", mount, allow_newlines=False)
            parts = mount.split(":")
            ok = (
                len(parts) in (1, 2, 3)
                and all(p.startswith("/") and "," not in p and " " not in p for p in parts[:2])
                and (len(parts) < 3 or bool(MOUNT_FLAG_RE.fullmatch(parts[2])))
            )
            if not ok:
                raise invalid(
                    "container_mounts",
                    mount,
                    "each mount is /source[:/target[:flags]] with absolute paths, no commas or spaces",
                )
        if mounts and image is None:
            raise invalid("container_mounts", list(mounts), "container mounts need an image; set image or drop them")
        put("container_mounts", mounts)
        inputs = tuple(
            dict.fromkeys(
                normalize_storage_path(p, f"SbatchSpec.inputs[{i}]")
                for i, p in enumerate(str_tuple("inputs", self.inputs))
            )
        )
        put("inputs", inputs)
        workdir = self.container_workdir
        if workdir is not None:
            if image is None:
                raise invalid("container_workdir", workdir, "a container working directory needs an image")
            if not check_text("container_workdir", workdir, allow_newlines=False).startswith("/"):
                raise invalid("container_workdir", workdir, "must be an absolute path inside the container")
        if image is not None:  # the job's own paths are mounted into the container at the same place
            check_mountable(self.results_dir, "SbatchSpec.results_dir")
            for index, path in enumerate(inputs):
                check_mountable(path, f"SbatchSpec.inputs[{index}]")

    def _check_environment(self, put: Any) -> None:
        if not isinstance(self.environment, Mapping):
            raise invalid("environment", self.environment, "must be a mapping of NAME -> value")
        env: dict[str, str] = {}
        for name in sorted(self.environment):
            value = self.environment[name]
            if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
                raise invalid("environment", name, "variable names must match [A-Za-z_][A-Za-z0-9_]*")
            if name in RESERVED_ENV:
                raise invalid("environment", name, "is set by the sbatch template itself; do not set it")
            if SECRET_NAME_RE.search(name):
                raise invalid(
                    "environment",
                    name,
                    "looks like a credential; secrets must not appear in the script: pass them through the "
                    "sidecar env file (env_file / secret environment of the operator)",
                )
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise invalid("environment", {name: value}, "values must be strings (or numbers)")
            env[name] = check_text(f"environment[{name!r}]", str(value))
            size = len(env[name].encode("utf-8"))
            if size > MAX_SCRIPT_BYTES:
                raise invalid(
                    "environment",
                    f"{name}=<{size} bytes>",
                    f"is {size} bytes; it is exported in the batch script, which Slurm refuses above "
                    f"{MAX_SCRIPT_BYTES} bytes (max_script_size, 4 MB by default): stage the data as a file on "
                    "shared storage and pass its path instead",
                )
            if not self.placeholders_bound:
                check_placeholders(env[name], f"SbatchSpec.environment[{name!r}]")
        put("environment", env)
        secret_names = str_tuple("secret_env_names", self.secret_env_names)
        for name in secret_names:
            if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name) or name in RESERVED_ENV:
                raise invalid("secret_env_names", name, "must be variable names the template does not set itself")
        put("secret_env_names", tuple(dict.fromkeys(secret_names)))

    def _check_commands(self, put: Any) -> None:
        check_flag("placeholders_bound", self.placeholders_bound)
        bound = self.placeholders_bound
        if not bound:
            check_placeholders(self.command, "SbatchSpec.command")
        for name in ("pre_commands", "post_commands", "leader_post_commands"):
            commands = str_tuple(name, getattr(self, name))
            for command in commands:
                if not check_text(name, command).strip():
                    raise invalid(name, command, "empty command; remove it")
                if not bound:
                    check_placeholders(command, f"SbatchSpec.{name}")
            put(name, commands)

    def _check_extra_sbatch(self, put: Any) -> None:
        options = str_tuple("extra_sbatch", self.extra_sbatch)
        refuse_cluster_options(options)
        for option in options:
            check_text("extra_sbatch", option, allow_newlines=False)
            m = EXTRA_SBATCH_RE.fullmatch(option)
            if not m:
                raise invalid(
                    "extra_sbatch", option, "each entry is one long option like '--qos=high' (no spaces or quotes)"
                )
            if m.group(1) == "signal":  # the task must pass the signal on to the command (templates/slurm)
                raise invalid("extra_sbatch", option, "use checkpoint_signal (e.g. 'USR1@900') for this warning")
            if m.group(1) == "open-mode":  # scripts.sbatch_directives: a requeued run's output follows the earlier
                raise invalid("extra_sbatch", option, "npa-airflow sets --open-mode=append for a job with requeue=True")
            if m.group(1) in OWNED_SBATCH_OPTIONS:
                raise invalid("extra_sbatch", option, f"--{m.group(1)} is set from the spec's own fields; use those")
        put("extra_sbatch", options)
        check_flag("requeue", self.requeue)

    def _check_nodes_and_files(self, put: Any) -> None:
        excludes = str_tuple("exclude_nodes", self.exclude_nodes)
        for node in excludes:
            if not isinstance(node, str) or not NODE_EXPR_RE.fullmatch(node):
                raise invalid("exclude_nodes", node, "must be node names or hostlist expressions like g[1-2]")
        put("exclude_nodes", tuple(dict.fromkeys(excludes)))
        if self.env_file is not None:
            put("env_file", normalize_storage_path(self.env_file, "SbatchSpec.env_file"))
        for name, default in (("stdout_path", "main.out"), ("stderr_path", "main.err")):
            value = getattr(self, name)
            if value is None:
                value = f"{self.log_dir.rstrip('/')}/{self.job_name}/{default}"
            value = self._log_path(name, normalize_storage_path(value, f"SbatchSpec.{name}"))
            if "%" in posixpath.dirname(value):
                raise invalid(name, value, "Slurm does not create log directories: use %j/%x in the file name only")
            if value.endswith("/"):
                raise invalid(name, value, "must name a file, not a directory")
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
        return wall_seconds(self.time_hours) // 60

    @property
    def checkpoint(self) -> CheckpointSignal | None:
        """The checkpoint warning (signal name and seconds before the limit), or None."""
        if self.checkpoint_signal is None:
            return None
        name, seconds = self.checkpoint_signal.split("@")
        return CheckpointSignal(name, int(seconds))

    @property
    def timeout_seconds(self) -> int:
        assert self.timeout_hours is not None  # set in __post_init__
        return child_timeout_seconds(self.timeout_hours)

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

    def excluding(self, nodes: Iterable[str]) -> SbatchSpec:
        """A copy that also keeps off `nodes` (an earlier try's bad nodes), after the spec's own exclusions."""
        return replace(self, exclude_nodes=(*self.exclude_nodes, *nodes))
