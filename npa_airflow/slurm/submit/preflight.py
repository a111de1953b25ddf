"""Preflight on the login host (pure): one shell command that inspects everything, and a parser that turns
its output into failures, each naming what is missing and what to do. Nothing is written or submitted.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from npa_airflow.common.remote_errors import sacct_accounting_disabled, slurmctld_unreachable
from npa_airflow.exceptions import NpaParseError, NpaValidationError
from npa_airflow.slurm.commands import PartitionInfo, parse_partitions
from npa_airflow.slurm.submit.storage_paths import normalize_storage_path

SLURM_TOOLS = ("sbatch", "srun", "squeue", "sacct", "scancel")
_MARK = "NPA_PF"
_PARTITION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

REMEDIATION = {
    "tool": (
        "the Slurm client tools must be on the login user's PATH for non-interactive SSH sessions "
        "(ssh -o BatchMode=yes <host> command -v sbatch); load the site's Slurm module in ~/.bashrc "
        "or pick a login host that has them"
    ),
    "pyxis": (
        "the generated jobs depend on srun --container-image: ask the cluster admin to enable Pyxis/Enroot "
        "or use a different platform"
    ),
    "enroot": (
        "the .sqsh conversion runs enroot import on a CPU node: ask the cluster admin to install Enroot, "
        "or pre-stage the .sqsh image on shared storage and pass its path"
    ),
    "results_root": (
        "create it on shared storage (e.g. Lustre) with write access for the cluster user, or set a different "
        "results_root on the slurm connection"
    ),
    "sqsh_cache_dir": (
        "create it on shared storage with write access for the cluster user, or set a different sqsh_cache_dir "
        "on the slurm connection"
    ),
    "dataset": (
        "stage the data on shared storage (e.g. Lustre) first and reference that path, or correct the path; "
        "never fetch the training set inside the GPU allocation"
    ),
    "partition": "name an existing partition (scontrol show partitions lists them) on the operator or connection",
    "wall_time": "ask for a shorter wall time, or pick a partition whose MaxTime allows it",
    "controller": "slurmctld did not answer (down, restarting or overloaded); retry later or ask the cluster admin",
}


def dataset_path(value: str) -> str:
    """``lustre:///abs`` or ``/abs`` -> ``/abs``; local ``file://``, relative and object-store paths are refused."""
    return normalize_storage_path(value, "dataset_paths")


@dataclass(frozen=True)
class PreflightRequest:
    tools: tuple[str, ...] = SLURM_TOOLS
    check_pyxis: bool = True
    check_enroot: bool = True
    writable_dirs: tuple[tuple[str, str], ...] = ()  # (label, path)
    dataset_paths: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    time_minutes: int | None = None
    check_accounting: bool = True  # report whether the cluster keeps accounting (a site without slurmdbd)

    def __post_init__(self) -> None:
        for tool in self.tools:
            if not re.match(r"^[A-Za-z0-9_.+-]{1,64}$", tool):
                raise NpaValidationError(f"tools: {tool!r} is not a command name")
        for label, path in self.writable_dirs:
            if not path.startswith("/") or any(c in path for c in "\n\r\x00"):
                raise NpaValidationError(f"{label}={path!r} must be an absolute path on shared storage")
        for path in self.dataset_paths:
            dataset_path(path)
        for name in self.partitions:
            if not _PARTITION.match(name or ""):
                raise NpaValidationError(f"partition {name!r} is not a partition name")
        if self.time_minutes is not None and (
            isinstance(self.time_minutes, bool) or not isinstance(self.time_minutes, int) or self.time_minutes < 1
        ):
            raise NpaValidationError(f"time_minutes={self.time_minutes!r} must be a positive integer")


def build_preflight_command(req: PreflightRequest, cluster: str | None = None) -> str:
    """One read-only shell command; every line of interest starts with ``NPA_PF``."""
    lines = ["set -u"]
    for tool in req.tools:
        q = shlex.quote(tool)
        lines.append(f'printf "{_MARK} tool %s %s\\n" {q} "$(command -v {q} || echo -)"')
    if req.check_pyxis:
        lines.append(
            f"if srun --help 2>&1 | grep -q -- --container-image; then echo '{_MARK} pyxis yes'; "
            f"else echo '{_MARK} pyxis no'; fi"
        )
    if req.check_enroot:
        lines.append(f'printf "{_MARK} enroot %s\\n" "$(command -v enroot || echo -)"')
    for label, path in req.writable_dirs:
        q = shlex.quote(path)
        # access(2) W_OK also reports a read-only mount; nothing is created.
        lines.append(
            f"if [ -d {q} ] && [ -w {q} ]; then s=ok; elif [ -e {q} ]; then s=notwritable; else s=missing; fi; "
            f'printf "{_MARK} dir %s %s %s\\n" {shlex.quote(label)} "$s" {q}'
        )
    for path in req.dataset_paths:
        q = shlex.quote(dataset_path(path))
        lines.append(f'if [ -e {q} ]; then s=ok; else s=missing; fi; printf "{_MARK} path %s %s\\n" "$s" {q}')
    mflag = f"-M {shlex.quote(cluster)} " if cluster else ""
    if req.check_accounting:  # an empty window: sacct answers at once where there is accounting
        lines.append(
            f"if e=$(sacct {mflag}-X -n -o JobID -S now -E now 2>&1 >/dev/null); then echo '{_MARK} accounting yes'; "
            f'else printf "{_MARK} accounting-error %s\\n" "$(printf %s "$e" | head -n 1)"; fi'
        )
    if req.partitions:
        lines.append(f"echo '{_MARK} partitions-begin'")
        lines.append(f"scontrol {mflag}--oneliner show partitions 2>&1 || echo '{_MARK} partitions-error'")
        lines.append(f"echo '{_MARK} partitions-end'")
    lines.append(f"echo '{_MARK} done'")
    return "\n".join(lines)


@dataclass(frozen=True)
class PreflightFailure:
    what: str  # e.g. "tool sbatch", "dataset /lustre/x"
    problem: str
    remedy: str
    transient: bool = False  # the controller did not answer: asking again may succeed

    def __str__(self) -> str:
        return f"{self.what}: {self.problem}. Fix: {self.remedy}"


@dataclass(frozen=True)
class PreflightReport:
    tools: dict[str, str | None] = field(default_factory=dict)
    pyxis: bool | None = None
    enroot: str | None = None
    partitions: dict[str, PartitionInfo] = field(default_factory=dict)
    failures: tuple[PreflightFailure, ...] = ()
    # True: sacct answers; False: "accounting storage is disabled" (no slurmdbd: the provider reads states from
    # squeue, scontrol and end records); None: not checked, or sacct failed otherwise (accounting_error says how)
    accounting: bool | None = None
    accounting_error: str | None = None

    @property
    def accounting_mode(self) -> str:
        """The cluster's accounting, in words (the preflight's log line)."""
        if self.accounting:
            return "accounting (sacct answers)"
        if self.accounting is False:
            return "no accounting (no slurmdbd): job states from squeue, scontrol show job and each job's end record"
        return f"accounting unknown (sacct: {self.accounting_error})" if self.accounting_error else "not checked"

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def only_transient(self) -> bool:
        return bool(self.failures) and all(f.transient for f in self.failures)

    def to_dict(self) -> dict:
        """JSON-safe summary (XCom)."""
        return {
            "ok": self.ok,
            "tools": self.tools,
            "pyxis": self.pyxis,
            "enroot": self.enroot,
            "partitions": {n: p.max_time_minutes for n, p in self.partitions.items()},
            "accounting": self.accounting,
            "failures": [str(f) for f in self.failures],
        }


@dataclass
class _PreflightOutput:
    """The ``NPA_PF`` lines of one preflight run, sorted by kind."""

    tools: dict[str, str | None] = field(default_factory=dict)
    pyxis: bool | None = None
    enroot: str | None = None
    dirs: dict[str, tuple[str, str]] = field(default_factory=dict)  # label -> (status, path)
    paths: dict[str, str] = field(default_factory=dict)  # dataset path -> status
    partition_lines: list[str] = field(default_factory=list)
    partition_error: bool = False
    accounting: bool | None = None
    accounting_error: str | None = None

    def read_mark(self, kind: str, rest: str) -> None:
        if kind == "tool":
            name, _, where = rest.partition(" ")
            self.tools[name] = None if where in ("", "-") else where
        elif kind == "pyxis":
            self.pyxis = rest == "yes"
        elif kind == "enroot":
            self.enroot = None if rest in ("", "-") else rest
        elif kind == "dir":
            label, status, path = rest.split(" ", 2)
            self.dirs[label] = (status, path)
        elif kind == "path":
            status, _, path = rest.partition(" ")
            self.paths[path] = status
        elif kind == "accounting":
            self.accounting = rest == "yes"
        elif kind == "accounting-error":
            self.accounting = False if sacct_accounting_disabled(rest) else None
            self.accounting_error = rest.strip() or "no message"


def _read_preflight_output(stdout: str) -> _PreflightOutput:
    out = _PreflightOutput()
    in_partitions = False
    for line in stdout.splitlines():
        if line == f"{_MARK} partitions-begin":
            in_partitions = True
        elif line == f"{_MARK} partitions-end":
            in_partitions = False
        elif line == f"{_MARK} partitions-error":
            out.partition_error = True
        elif in_partitions:
            out.partition_lines.append(line)
        elif line.startswith(_MARK + " "):
            kind, _, rest = line[len(_MARK) + 1 :].partition(" ")
            out.read_mark(kind, rest)
    return out


def _login_host_failures(out: _PreflightOutput, req: PreflightRequest) -> list[PreflightFailure]:
    """Missing tools, Pyxis, Enroot, writable directories and datasets."""
    failures: list[PreflightFailure] = []
    for tool in req.tools:
        if not out.tools.get(tool):
            failures.append(PreflightFailure(f"tool {tool}", "not found on the login host", REMEDIATION["tool"]))
    if req.check_pyxis and not out.pyxis:
        failures.append(PreflightFailure("Pyxis", "srun --help does not list --container-image", REMEDIATION["pyxis"]))
    if req.check_enroot and not out.enroot:
        failures.append(PreflightFailure("Enroot", "enroot not found on the login host", REMEDIATION["enroot"]))
    for label, path in req.writable_dirs:
        status, _ = out.dirs.get(label, ("missing", path))
        if status != "ok":
            problem = "does not exist" if status == "missing" else "is not a writable directory"
            remedy = REMEDIATION.get(label, REMEDIATION["results_root"])
            failures.append(PreflightFailure(f"{label} {path}", problem, remedy))
    for raw in req.dataset_paths:
        path = dataset_path(raw)
        if out.paths.get(path) != "ok":
            failures.append(
                PreflightFailure(f"dataset {raw}", "does not exist (test -e on the login host)", REMEDIATION["dataset"])
            )
    return failures


def _partition_failures(
    info: PartitionInfo | None, name: str, known: str, req: PreflightRequest
) -> list[PreflightFailure]:
    """What is wrong with one requested partition (``info`` None: it does not exist)."""
    if info is None:
        return [PreflightFailure(f"partition {name}", f"does not exist (known: {known})", REMEDIATION["partition"])]
    failures: list[PreflightFailure] = []
    limit = info.max_time_minutes
    if req.time_minutes is not None and limit is not None and req.time_minutes > limit:
        failures.append(
            PreflightFailure(
                f"partition {name}",
                f"MaxTime is {limit} min, the job asks for {req.time_minutes} min",
                REMEDIATION["wall_time"],
            )
        )
    if info.state and info.state.upper() not in ("UP", ""):
        failures.append(
            PreflightFailure(f"partition {name}", f"is {info.state}, not UP", "wait for the admins or pick another")
        )
    return failures


def _check_partitions(
    out: _PreflightOutput, req: PreflightRequest
) -> tuple[dict[str, PartitionInfo], list[PreflightFailure]]:
    if not req.partitions:
        return {}, []
    if out.partition_error:
        text = " ".join(out.partition_lines)[-300:]
        transient = slurmctld_unreachable(text)
        failure = PreflightFailure(
            "partitions",
            f"scontrol show partitions failed: {text}",
            REMEDIATION["controller" if transient else "tool"],
            transient=transient,
        )
        return {}, [failure]
    partitions = parse_partitions("\n".join(out.partition_lines))
    known = ", ".join(sorted(partitions)) or "none"
    failures = [
        failure
        for name in dict.fromkeys(req.partitions)
        for failure in _partition_failures(partitions.get(name), name, known, req)
    ]
    return partitions, failures


def parse_preflight(stdout: str, req: PreflightRequest) -> PreflightReport:
    if f"{_MARK} done" not in stdout:
        raise NpaParseError(f"preflight output is incomplete: {stdout[-800:]!r}")
    out = _read_preflight_output(stdout)
    failures = _login_host_failures(out, req)
    partitions, partition_failures = _check_partitions(out, req)
    return PreflightReport(
        tools=out.tools,
        pyxis=out.pyxis,
        enroot=out.enroot,
        partitions=partitions,
        failures=tuple(failures + partition_failures),
        accounting=out.accounting,
        accounting_error=out.accounting_error,
    )
