"""What each `SbatchSpec` field may hold: the seed's defaults and limits, and the checks of single fields.

The checks of the job's shape (nodes, GPUs, CPUs, wall time, child timeout, requeue) and of the cluster options
stand alone too: `check_request` is the operator's parse-time check, a pure function of its arguments that
refuses exactly what `SbatchSpec` would refuse in those fields, with the same messages. Every error names the
field, the value and the fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from npa_airflow.exceptions import NpaValidationError
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
        "NPA_CHECKPOINT_SIGNAL",
        "NPA_CHECKPOINT_SECONDS",
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
        "exclude", "wait-all-nodes", "parsable", "wrap", "array", "chdir", "signal", "open-mode",
    }
)  # fmt: skip
EXTRA_SBATCH_RE = re.compile(r"--([a-z][a-z0-9-]*)(?:=([A-Za-z0-9_.,:=@%+/-]+))?")
# --clusters/-M (and sbatch's alias --cluster) choose the cluster. Every later squeue, sacct and scancel of the
# job must name the same one, so it comes from the connection (extra "cluster_name"), never from extra_sbatch.
CLUSTER_OPTION_RE = re.compile(r"--clusters?(?:[=\s](?P<long>.*))?|-M(?P<short>.*)", re.S)
MOUNT_FLAG_RE = re.compile(r"[a-z]+(?:\+[a-z]+)*")
# checkpoint_signal: the signals a training script can trap for a checkpoint, and sbatch's limit of --signal's time.
CHECKPOINT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")
MAX_SIGNAL_SECONDS = 65535
CHECKPOINT_SIGNAL_RE = re.compile(r"(?:SIG)?(?P<name>[A-Z0-9]+)@(?P<seconds>[0-9]{1,9})", re.I)
CHECKPOINT_FORM = (
    f"write '<SIGNAL>@<seconds>': SIGNAL one of {', '.join(CHECKPOINT_SIGNALS)} (an optional SIG prefix), seconds "
    f"before the time limit an integer 1..{MAX_SIGNAL_SECONDS}, e.g. 'USR1@900'"
)


class CheckpointSignal(NamedTuple):
    """A checkpoint warning: Slurm sends signal `name` (USR1, ...) `seconds` before the job's time limit."""

    name: str
    seconds: int

    def __str__(self) -> str:
        return f"{self.name}@{self.seconds}"


def invalid(field_name: str, value: object, fix: str) -> NpaValidationError:
    """The error for a bad field: ``SbatchSpec.<field>=<value>: <fix>``."""
    return NpaValidationError(f"SbatchSpec.{field_name}={value!r}: {fix}")


def check_text(field_name: str, value: object, *, allow_newlines: bool = True) -> str:
    if not isinstance(value, str):
        raise invalid(field_name, value, "must be a string")
    if "\x00" in value:
        raise invalid(field_name, value, "contains a NUL character; remove it")
    if "\r" in value:  # sbatch refuses a whole script with DOS line breaks, after it was staged
        raise invalid(field_name, value, "contains a carriage return (CR); use plain newlines")
    if not allow_newlines and ("\n" in value or "\r" in value):
        raise invalid(field_name, value, "must be a single line")
    return value


def int_field(name: str, value: object, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise invalid(name, value, f"must be an integer {bound}")
    return value


def hours_field(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise invalid(name, value, "must be a positive number of hours")
    return float(value)


def str_tuple(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise invalid(name, value, "must be a list of strings")
    return tuple(value)


def check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise invalid(name, value, "must be True or False")


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
        raise invalid(
            "extra_sbatch",
            option,
            "choose the cluster with the Slurm connection instead: a connection with the same login host and user "
            f'and the extra "cluster_name": "{cluster}", passed as slurm_conn_id. Then every sbatch, squeue, sacct '
            f"and scancel of the job names that cluster (-M {cluster}); from extra_sbatch only sbatch would. Remove "
            "this option (and its value) from extra_sbatch",
        )


def check_resources(nodes: object, gpus_per_node: object, max_gpus_per_node: object, cpus_per_task: object) -> None:
    """Nodes, GPUs per node (at most the node's maximum, with a hint) and CPUs per task."""
    nodes = int_field("nodes", nodes, 1, MAX_NODES)
    most = int_field("max_gpus_per_node", max_gpus_per_node, 1, 1024)
    per_node = int_field("gpus_per_node", gpus_per_node, 0)
    if per_node > most:
        whole, rest = divmod(per_node, most)
        hint = (
            f"use nodes={whole * nodes}, gpus_per_node={most}"
            if not rest
            else f"use at most {most} per node and more nodes"
        )
        raise invalid("gpus_per_node", per_node, f"a node has at most {most} GPUs: {hint}")
    int_field("cpus_per_task", cpus_per_task, 1, 4096)


def child_timeout_hours(
    time_hours: float, timeout_hours: float | None, max_time_hours: float | None, partition: str | None = None
) -> float:
    """The child timeout for a wall time (95 % of it when unset), after checking both and the partition's
    maximum (`max_time_hours`, None = unlimited; `partition` only names it in the message)."""
    wall = hours_field("time_hours", time_hours)
    if max_time_hours is not None:
        limit = hours_field("max_time_hours", max_time_hours)
        if wall > limit:
            where = f"partition {partition!r}" if partition else "the default partition"
            raise invalid(
                "time_hours",
                time_hours,
                f"exceeds the {limit:g} h maximum of {where}; lower time_hours or choose a partition "
                "whose MaxTime allows it",
            )
    if timeout_hours is None:
        return round(wall * CHILD_TIMEOUT_FRACTION, 6)
    if hours_field("timeout_hours", timeout_hours) >= wall:
        raise invalid(
            "timeout_hours",
            timeout_hours,
            f"the child timeout must be shorter than the wall time ({wall:g} h) so post commands and the "
            "success marker still run; leave it unset for 95 % of time_hours",
        )
    return timeout_hours


def wall_seconds(time_hours: float) -> int:
    """The time limit Slurm enforces for `time_hours`, in seconds: `#SBATCH --time` takes whole minutes."""
    return math.ceil(time_hours * 60) * 60


def child_timeout_seconds(timeout_hours: float) -> int:
    """The seconds the command runs before the child timeout stops it (the template's timeout)."""
    return math.floor(timeout_hours * 3600)


def check_checkpoint_signal(value: object, time_hours: float, timeout_hours: float) -> CheckpointSignal | None:
    """`value` ('USR1@300', 'sigusr1@300', ...) as a `CheckpointSignal` (None when unset), after checking it against
    the time limit and the child timeout (both checked already: `child_timeout_hours`)."""
    if value is None:
        return None
    m = CHECKPOINT_SIGNAL_RE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        prefixed = isinstance(value, str) and value[:2].upper() in ("B:", "R:")
        hint = "no B: or R: prefix (the signal is for the command, not the batch shell); " if prefixed else ""
        raise invalid("checkpoint_signal", value, hint + CHECKPOINT_FORM)
    name, seconds = m.group("name").upper(), int(m.group("seconds"))
    if name not in CHECKPOINT_SIGNALS:
        raise invalid("checkpoint_signal", value, f"{name} is not a signal to checkpoint on; {CHECKPOINT_FORM}")
    if not 1 <= seconds <= MAX_SIGNAL_SECONDS:
        raise invalid("checkpoint_signal", value, f"{seconds} s is outside Slurm's range; {CHECKPOINT_FORM}")
    wall = wall_seconds(time_hours)
    if seconds >= wall:
        raise invalid(
            "checkpoint_signal",
            value,
            f"the time limit is {wall} s after the start (time_hours={time_hours:g}), so a warning {seconds} s "
            "before it would come before the job runs: ask for fewer seconds, or raise time_hours",
        )
    lead = wall - child_timeout_seconds(timeout_hours)
    if seconds <= lead:
        example = f" (e.g. '{name}@{lead + 60}')" if lead + 60 < wall else ""
        raise invalid(
            "checkpoint_signal",
            value,
            f"the command is stopped at its child timeout, {lead} s before the time limit (timeout_hours="
            f"{timeout_hours:g}; 95 % of time_hours unless set), so a warning {seconds} s before the limit would "
            f"come after it: ask for more than {lead} s{example}, or set timeout_hours closer to time_hours",
        )
    return CheckpointSignal(name, seconds)


MAX_SEGMENTS = 1000  # a run continued over more Slurm jobs than this is a loop, not a training run


def check_max_segments(value: object) -> int:
    """How many Slurm jobs a long run may take (1: no continuation; `npa_airflow.slurm.operators.segments`)."""
    return int_field("max_segments", value, 1, MAX_SEGMENTS)


def check_request(
    *,
    extra_sbatch: Iterable[object],
    nodes: Any,
    gpus_per_node: Any,
    max_gpus_per_node: Any,
    cpus_per_task: Any,
    time_hours: Any,
    timeout_hours: Any,
    max_time_hours: Any,
    requeue: Any,
    checkpoint_signal: Any = None,
    max_segments: Any = 1,
) -> None:
    """The operator's parse-time check: what `SbatchSpec` refuses in these fields, in its order and words, without
    building one (the text fields are Jinja templates, checked once they are rendered)."""
    refuse_cluster_options(extra_sbatch)  # the cluster comes from the connection (see the message)
    check_resources(nodes, gpus_per_node, max_gpus_per_node, cpus_per_task)
    timeout = child_timeout_hours(time_hours, timeout_hours, max_time_hours)
    check_checkpoint_signal(checkpoint_signal, time_hours, timeout)
    check_flag("requeue", requeue)
    check_max_segments(max_segments)


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
