"""The collective-transport (NCCL) probe, pure parts: knob sets, the probe job script, outcomes, the cache.

Before a multi-node run (or one node with 2+ GPUs, where the intra-node P2P hang strikes), a cheap all-reduce
runs under the container's torchrun with a ~120 s bound. A hang moves on to the next knob set; the first set
that works is cached per cluster and partition, so later runs skip the probe.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from npa_airflow.common.naming import validate_job_name
from npa_airflow.common.templates import templates_dir
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.container import container_srun_options
from npa_airflow.slurm.submit.enroot import directive_path, render_template
from npa_airflow.slurm.submit.images import require_sqsh_image

PROBE_TEMPLATE = "probe/probe.sbatch.j2"
PROBE_SCRIPT = "probe/nccl_allreduce_probe.py"
DEFAULT_TIMEOUT_SECONDS = 120
TIMEOUT_EXIT_CODE = 124
DEFAULT_SOCKET_IFNAME = "eth0"
CACHE_VARIABLE_PREFIX = "npa_nccl_env"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PARTITION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Names the probe job sets itself; a knob set must not override them.
_RESERVED_ENV = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "NODE_RANK",
        "PATH",
        "probe_script",
        "npa_knobs",
        "rc",
    }
)


def default_knob_sets(socket_ifname: str = DEFAULT_SOCKET_IFNAME) -> list[dict[str, str]]:
    """The seed's escalation: nothing, then the P2P knob, then also IB off and a pinned socket interface."""
    return [
        {},
        {"NCCL_P2P_DISABLE": "1"},
        {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": socket_ifname},
    ]


def validate_env(env: Mapping[str, Any], field_name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if not isinstance(env, Mapping):
        raise NpaValidationError(f"{field_name}={env!r} must be a mapping of environment variable names to values")
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise NpaValidationError(f"{field_name}: {name!r} is not an environment variable name")
        if name in _RESERVED_ENV:
            raise NpaValidationError(f"{field_name}: {name} is set by the probe itself and cannot be overridden")
        text = str(value)
        if "\x00" in text or "\n" in text:
            raise NpaValidationError(f"{field_name}: the value of {name} contains a NUL or line break")
        out[name] = text
    return out


def validate_knob_sets(knob_sets: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    if isinstance(knob_sets, (str, bytes)) or not isinstance(knob_sets, Sequence) or not knob_sets:
        raise NpaValidationError(
            f"knob_sets={knob_sets!r} must be a non-empty list of environment mappings, tried in order "
            "(e.g. [{}, {'NCCL_P2P_DISABLE': '1'}])"
        )
    return [validate_env(k, f"knob_sets[{i}]") for i, k in enumerate(knob_sets)]


def knobs_label(env: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(env.items())) or "(none)"


def probe_needed(nodes: int, gpus_per_node: int) -> bool:
    """Multi-node, or one node with 2+ GPUs (the intra-node P2P hang needs no second node)."""
    return nodes > 1 or gpus_per_node > 1


@dataclass(frozen=True)
class ProbeSpec:
    job_name: str
    partition: str
    script_path: str
    stdout_path: str
    stderr_path: str
    nodes: int = 2
    gpus_per_node: int = 0
    procs_per_node: int = 1
    image: str | None = None
    mounts: tuple[str, ...] = ()  # --container-mounts entries (container.merge_mounts)
    env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    account: str | None = None
    workdir: str | None = None  # where the probe starts in the container; None = the script's directory

    def __post_init__(self) -> None:
        validate_job_name(self.job_name)
        if not _PARTITION.match(self.partition or ""):
            raise NpaValidationError(f"partition={self.partition!r} is not a partition name")
        if self.account is not None and not _PARTITION.match(self.account):
            raise NpaValidationError(f"account={self.account!r} is not a valid Slurm account name")
        for name, value, low, high in (
            ("nodes", self.nodes, 1, 2),
            ("gpus_per_node", self.gpus_per_node, 0, 64),
            ("procs_per_node", self.procs_per_node, 1, 64),
            ("timeout_seconds", self.timeout_seconds, 10, 3600),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise NpaValidationError(f"{name}={value!r} must be an integer from {low} to {high}")
        if not self.script_path.startswith("/") or any(c in self.script_path for c in "\n\r\x00"):
            raise NpaValidationError(f"script_path={self.script_path!r} must be an absolute path on shared storage")
        if self.image is not None:
            require_sqsh_image(self.image)
        for mount in self.mounts:
            if not mount or "," in mount or any(c in mount for c in "\n\r\x00") or not mount.startswith("/"):
                raise NpaValidationError(f"mounts: {mount!r} must be SRC[:DST[:FLAGS]] with an absolute SRC")
        if self.workdir is not None and (
            not self.workdir.startswith("/") or any(c in self.workdir for c in "\n\r\x00")
        ):
            raise NpaValidationError(f"workdir={self.workdir!r} must be an absolute path inside the container")
        validate_env(self.env, "env")
        directive_path(self.stdout_path, "stdout_path")
        directive_path(self.stderr_path, "stderr_path")

    @property
    def time_minutes(self) -> int:
        return -(-self.timeout_seconds // 60) + 2

    def container_args(self) -> list[str]:
        """The Pyxis options as shell words: the mounts, the working directory, and every name the probe job
        exports on the host (its own values win over an image's ENV)."""
        if self.image is None:
            return []
        workdir = self.workdir or posixpath.dirname(self.script_path)
        names = ("MASTER_ADDR", "MASTER_PORT", *sorted(self.env))
        return container_srun_options(self.image, self.mounts, workdir, names)


def render_probe_script(spec: ProbeSpec) -> str:
    values = {
        **asdict(spec),
        "env": sorted(spec.env.items()),
        "time_minutes": spec.time_minutes,
        "container_args": spec.container_args(),
        "timeout_exit_code": TIMEOUT_EXIT_CODE,
        "knobs_label": knobs_label(spec.env),
    }
    return render_template(PROBE_TEMPLATE, **values)


def probe_source() -> bytes:
    return (templates_dir() / PROBE_SCRIPT).read_bytes()


# --- outcomes -------------------------------------------------------------------------------------------


def classify_probe_event(event: Mapping[str, Any]) -> str:
    """ "ok", "hang" (timeout: try the next knob set) or "error" (anything else: knobs will not help)."""
    status = event.get("status")
    if status == "success":
        return "ok"
    if event.get("native_state") == "TIMEOUT" or status == "deadline":
        return "hang"
    if status == "failed" and event.get("exit_code") == TIMEOUT_EXIT_CODE:
        return "hang"
    if "NPA_PROBE_TIMEOUT" in str(event.get("log_tail") or ""):
        return "hang"
    return "error"


# --- per-cluster cache (an Airflow Variable) -----------------------------------------------------------------


def cache_key(conn_id: str, partition: str) -> str:
    return f"{CACHE_VARIABLE_PREFIX}::{conn_id}::{partition}"


def encode_cache(env: Mapping[str, str], *, job_id: str, knob_index: int, probed_at: str) -> str:
    return json.dumps(
        {"env": dict(env), "job_id": job_id, "knob_index": knob_index, "probed_at": probed_at}, sort_keys=True
    )


def decode_cache(text: str | None) -> dict[str, str] | None:
    """The cached working env, or None when absent or unreadable (then the probe runs again)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        return validate_env(data["env"], "cached env")
    except (ValueError, KeyError, TypeError, NpaValidationError):
        return None
