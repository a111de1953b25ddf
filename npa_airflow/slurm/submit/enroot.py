"""Enroot on the cluster (pure): the CPU-side conversion job script, and the registry credentials file.

The conversion profile is the seed's (CS-OCI-ORD): a CPU partition, 4 CPUs, 7200M, no exclusive node, at least
120 minutes, ``TMPDIR=/tmp`` and a job-unique node-local ``ENROOT_TEMP_PATH``/``SLURM_ENROOT_TEMP_PATH``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass

from npa_airflow.common.naming import validate_job_name
from npa_airflow.common.templates import template_env
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.images import SQSH_CHECK_FUNCTION, ImageRef, parse_image_ref

CONVERT_TEMPLATE = "slurm/convert.sbatch.j2"
MIN_CONVERT_MINUTES = 120
DEFAULT_CONVERT_CPUS = 4
DEFAULT_CONVERT_MEM = "7200M"

_PARTITION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ACCOUNT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MEM = re.compile(r"^[1-9][0-9]{0,8}[KMGT]?$")
# #SBATCH lines are not parsed by a shell: paths there must need no quoting at all.
_DIRECTIVE_PATH = re.compile(r"^/[A-Za-z0-9_./%+=@,-]+$")
QOS_MEM_REASONS = ("QOSGrpMemLimit", "QOSGrpMem", "QOSMaxMemoryPerJob", "QOSMaxMemPerJob")


def render_template(name: str, **context: object) -> str:
    return template_env().get_template(name).render(**context)


def directive_path(path: str, field: str) -> str:
    if not _DIRECTIVE_PATH.match(path or ""):
        raise NpaValidationError(
            f"{field}={path!r} cannot go on an #SBATCH line: use an absolute path of letters, digits and "
            "'_ . / % + = @ , -' only (no spaces or quotes)"
        )
    return path


@dataclass(frozen=True)
class ConvertSpec:
    """One conversion job: ``image`` (a registry reference) to the .sqsh file ``target``."""

    image: str
    target: str
    job_name: str
    partition: str
    stdout_path: str
    stderr_path: str
    cpus: int = DEFAULT_CONVERT_CPUS
    mem: str = DEFAULT_CONVERT_MEM
    time_minutes: int = MIN_CONVERT_MINUTES
    account: str | None = None
    force: bool = False  # convert even when the target is already valid (``force_reconvert_latest``)

    def __post_init__(self) -> None:
        ref = self.image_ref  # validates
        if ref.is_sqsh:
            raise NpaValidationError(f"image={self.image!r} is already a .sqsh file; there is nothing to convert")
        if not self.target.startswith("/") or not self.target.endswith(".sqsh"):
            raise NpaValidationError(f"target={self.target!r} must be an absolute path ending in .sqsh")
        if any(c in self.target for c in "\n\r\x00"):
            raise NpaValidationError(f"target={self.target!r} contains a line break or NUL")
        validate_job_name(self.job_name)
        if not self.partition or not _PARTITION.match(self.partition):
            raise NpaValidationError(
                f"partition={self.partition!r} is not a partition name; set cpu_partition on the slurm connection "
                "or pass partition= (a CPU partition: conversion must never use a GPU allocation)"
            )
        if self.account is not None and not _ACCOUNT.match(self.account):
            raise NpaValidationError(f"account={self.account!r} is not a valid Slurm account name")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or not 1 <= self.cpus <= 256:
            raise NpaValidationError(f"cpus={self.cpus!r} must be an integer from 1 to 256 (the seed's profile: 4)")
        if not _MEM.match(str(self.mem)):
            raise NpaValidationError(
                f"mem={self.mem!r} must be a Slurm memory size such as 7200M (always explicit: omitted memory is "
                "charged per CPU and can leave the job pending on QOSGrpMemLimit)"
            )
        if isinstance(self.time_minutes, bool) or not isinstance(self.time_minutes, int):
            raise NpaValidationError(f"time_minutes={self.time_minutes!r} must be an integer")
        if self.time_minutes < MIN_CONVERT_MINUTES:
            raise NpaValidationError(
                f"time_minutes={self.time_minutes} is below {MIN_CONVERT_MINUTES}: a short wall time can kill the "
                "conversion mid-write (the seed's profile asks for at least 120 minutes)"
            )
        directive_path(self.stdout_path, "stdout_path")
        directive_path(self.stderr_path, "stderr_path")

    @property
    def image_ref(self) -> ImageRef:
        return parse_image_ref(self.image)


def render_convert_script(spec: ConvertSpec) -> str:
    values = {
        **asdict(spec),
        "uri": spec.image_ref.enroot_uri,
        "check_function": SQSH_CHECK_FUNCTION,
        "force": bool(spec.force),
    }
    return render_template(CONVERT_TEMPLATE, **values)


def qos_memory_advice(job_id: str, reason: str | None, partition: str, cpus: int, mem: str) -> str | None:
    """The seed's advice for a conversion pending on a QOS memory limit, or None for any other reason."""
    if not reason or not any(r in reason for r in QOS_MEM_REASONS):
        return None
    return (
        f"conversion job {job_id} is PENDING on {reason}: the QOS's memory limit blocks it. Inspect what it asked "
        f"for (scontrol show job {job_id} | grep -E 'ReqTRES|MinMemory'; sacct -j {job_id} -o ReqCPUS,ReqMem), "
        f"cancel it, and retry with the explicit profile (-p {partition} -c{cpus} --mem={mem}, no exclusive node; "
        "do not inherit a training job's CPU count: omitted memory is charged per CPU). Do not wait for the QOS "
        "condition to clear, and never move the conversion into a GPU allocation."
    )


# --- registry credentials (~/.config/enroot/.credentials, netrc) ---------------------------------------------

NGC_REGISTRY = "nvcr.io"
NGC_AUTH_HOST = "authn.nvidia.com"
_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(?::[0-9]{1,5})?$")
_TOKEN = re.compile(r"^[^\s\x00]+$")
CREDENTIALS_MARK = "NPA_CREDENTIALS"


def _block_marks(key: str) -> tuple[str, str]:
    return f"# >>> npa-airflow {key} >>>", f"# <<< npa-airflow {key} <<<"


def build_credentials_block(registry: str, login: str, password: str, *, key: str) -> bytes:
    """netrc lines for ``registry`` (plus authn.nvidia.com for nvcr.io), between markers naming ``key``.

    The result holds the secret: it only ever travels on stdin.
    """
    if not _HOST.match(registry or ""):
        raise NpaValidationError(
            f"registry host {registry!r} is not a host name: set the connection's host to the registry, e.g. nvcr.io"
        )
    if not login or not _TOKEN.match(login):
        raise NpaValidationError(
            "the registry connection's login is empty or contains whitespace (for NGC use $oauthtoken)"
        )
    if not password or not _TOKEN.match(password):
        raise NpaValidationError("the registry connection's password is empty or contains whitespace")
    if not re.match(r"^[A-Za-z0-9_.-]{1,200}$", key):
        raise NpaValidationError(f"credentials key {key!r} must be letters, digits, '_', '.', '-'")
    hosts = [registry]
    if registry.split(":")[0] == NGC_REGISTRY:
        hosts.append(NGC_AUTH_HOST)
    begin, end = _block_marks(key)
    lines = [begin, *(f"machine {h} login {login} password {password}" for h in hosts), end]
    return ("\n".join(lines) + "\n").encode()


def build_install_credentials_command(key: str) -> str:
    """Install the block read from stdin into Enroot's credentials file, replacing an earlier block for ``key``.

    Atomic (temp file, mode 600, rename) and first in the file, so it wins over older entries for the same
    machine. Prints ``NPA_CREDENTIALS <path>``; the secret is never on the command line.
    """
    begin, end = _block_marks(key)
    return "\n".join(
        [
            "set -eu",
            "umask 077",
            'dir="${ENROOT_CONFIG_PATH:-${XDG_CONFIG_HOME:-$HOME/.config}/enroot}"',
            'f="$dir/.credentials"',
            'mkdir -p -- "$dir"',
            't=$(mktemp "$f.tmp.XXXXXX")',
            "trap 'rm -f -- \"$t\"' EXIT",
            '{ cat; if [ -f "$f" ]; then awk -v b='
            + shlex.quote(begin)
            + " -v e="
            + shlex.quote(end)
            + ' \'$0==b{skip=1;next} $0==e{skip=0;next} !skip\' "$f"; fi; } > "$t"',
            'chmod 600 "$t"',
            'mv -f -- "$t" "$f"',
            "trap - EXIT",
            f'printf "{CREDENTIALS_MARK} %s %s\\n" "$f" "$(stat -c %a "$f")"',
        ]
    )
