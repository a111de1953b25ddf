"""Render the sbatch script for an SbatchSpec, and the two gates every script passes before submit.

``render_sbatch`` is pure: same spec, same text (the operator shows it as a template field). The
single-node template runs pre -> primary (under the child timeout) -> post -> leader post in one srun
step (in the image's container when the spec has one: see container.py); the multi-node template extends it
with the rendezvous variables. With a checkpoint signal each task passes the signal (and SIGTERM) on to every
process of the primary, and keeps the child timeout itself (see the template). ``lint_script`` looks for
credentials that must never be in a script, ``bash_syntax_check`` runs ``bash -n`` locally.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterable
from typing import Any

from npa_airflow.common.templates import template_env
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.container import container_srun_options, merge_mounts
from npa_airflow.slurm.submit.layout import CONTINUE_FILE_NAME
from npa_airflow.slurm.submit.spec import SbatchSpec
from npa_airflow.slurm.submit.spec_fields import MASTER_PORT, MAX_SCRIPT_BYTES

SINGLENODE_TEMPLATE = "slurm/singlenode.sbatch.j2"
MULTINODE_TEMPLATE = "slurm/multinode.sbatch.j2"
# What the templates export on the host before srun: in a container these keep the job's values where the image
# sets the same names (--container-env). The other rendezvous variables are exported in the step itself.
JOB_ENV_NAMES = ("NPA_RESULTS_DIR", "NPA_CHILD_EXIT_CODE_FILE", "NPA_CHILD_TIMEOUT_SECONDS")
CHECKPOINT_ENV_NAMES = ("NPA_CHECKPOINT_SIGNAL", "NPA_CHECKPOINT_SECONDS")  # exported with checkpoint_signal only
SEGMENT_ENV_NAMES = ("NPA_SEGMENT", "NPA_MAX_SEGMENTS", "NPA_CONTINUE_FILE")  # exported with max_segments > 1 only
RENDEZVOUS_ENV_NAMES = ("MASTER_ADDR",)


def sbatch_directives(spec: SbatchSpec) -> list[str]:
    """The ``#SBATCH`` options of ``spec``, sorted (so a diff of two renders is easy to read)."""
    options = [
        f"--job-name={spec.job_name}",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        f"--cpus-per-task={spec.cpus_per_task}",
        f"--time={spec.time_minutes}",
        f"--output={spec.stdout_path}",
        f"--error={spec.stderr_path}",
        "--requeue" if spec.requeue else "--no-requeue",
    ]
    if spec.requeue:  # a requeued run appends to the output: the log stream goes on, nothing of the run before is lost
        options.append("--open-mode=append")
    if spec.multinode:
        options += ["--ntasks-per-node=1", "--wait-all-nodes=1"]
    if spec.gpus_per_node:
        options.append(f"--gres=gpu:{spec.gpus_per_node}")
    if spec.exclusive:
        options.append("--exclusive")
    if spec.partition:
        options.append(f"--partition={spec.partition}")
    if spec.account:
        options.append(f"--account={spec.account}")
    if spec.exclude_nodes:
        options.append(f"--exclude={','.join(spec.exclude_nodes)}")
    if spec.checkpoint_signal:  # no B: prefix: Slurm signals the step's tasks, not the batch shell
        options.append(f"--signal={spec.checkpoint_signal}")
    options.extend(spec.extra_sbatch)
    return sorted(options)


def srun_arguments(spec: SbatchSpec) -> list[str]:
    """srun options, already shell-quoted: one task per node."""
    return [shlex.quote(a) for a in (f"--ntasks={spec.nodes}", "--ntasks-per-node=1")]


def container_arguments(spec: SbatchSpec) -> list[str]:
    """The step's Pyxis options as shell words (none without an image): the results dir and inputs mounted at
    the same path before the author's mounts, the working directory, and every name the job exports. The
    results dir is written as the script's own ``"${NPA_RESULTS_DIR}"`` (shorter, and the same value)."""
    if not spec.image:
        return []

    def quote(value: str) -> str:
        return '"${NPA_RESULTS_DIR}"' if value == spec.results_dir else shlex.quote(value)

    mounts = merge_mounts((spec.results_dir, *spec.inputs), spec.container_mounts)
    rendezvous = RENDEZVOUS_ENV_NAMES if spec.multinode else ()
    checkpoint = CHECKPOINT_ENV_NAMES if spec.checkpoint_signal else ()
    segments = SEGMENT_ENV_NAMES if spec.max_segments > 1 else ()
    names = (*JOB_ENV_NAMES, *checkpoint, *segments, *rendezvous, *spec.environment, *spec.secret_env_names)
    workdir = spec.container_workdir or spec.results_dir
    return container_srun_options(spec.image, mounts, workdir, names, quote)


def render_sbatch(spec: SbatchSpec) -> str:
    """The complete sbatch script. Placeholders must be bound first (``spec.bind(...)``)."""
    if not spec.placeholders_bound:
        # Turns {{ / }} escapes into braces; a placeholder in use without a value is a clear error here.
        spec = spec.bind()
    template_name = MULTINODE_TEMPLATE if spec.multinode else SINGLENODE_TEMPLATE
    template = template_env().get_template(template_name)
    return template.render(
        template_name=template_name.rsplit("/", 1)[1],
        sbatch_directives=sbatch_directives(spec),
        job_name=spec.job_name,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        master_port=MASTER_PORT,
        env_file=spec.env_file,
        requeue=spec.requeue,
        environment=sorted(spec.environment.items()),
        results_dir=spec.results_dir,
        timeout_seconds=spec.timeout_seconds,
        checkpoint=spec.checkpoint,
        segments=_segments(spec),
        command=spec.command.rstrip("\n"),
        # verbatim (not indented): indenting would break a heredoc terminator inside a command
        pre_commands=[c.rstrip("\n") for c in spec.pre_commands],
        post_commands=[c.rstrip("\n") for c in spec.post_commands],
        leader_post_commands=[c.rstrip("\n") for c in spec.leader_post_commands],
        srun_args=srun_arguments(spec),
        container_args=container_arguments(spec),
    )


def _segments(spec: SbatchSpec) -> dict[str, Any] | None:
    """The template's view of a long run's segment (None for a job that is not continued)."""
    if spec.max_segments == 1:
        return None
    return {"segment": spec.segment, "max": spec.max_segments, "file_name": CONTINUE_FILE_NAME}


# ---------------------------------------------------------------------------------------------------------
# Secret lint

_TOKEN_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("NVIDIA API key", re.compile(r"\bnvapi-[A-Za-z0-9_-]{20,}")),
    ("Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}")),
    ("private key block", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
)
# NAME=literal where NAME looks like a credential; "$VAR", "${VAR}" and "$(...)" values are references.
_CREDENTIAL_ASSIGNMENT = re.compile(
    r"\b([A-Za-z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY|ACCESS_KEY|PRIVATE_KEY|_KEY|CREDENTIALS?))"
    r"\s*=\s*(['\"]?)(?![$'\"\s])([^\s'\";]+)",
    re.IGNORECASE,
)
_CREDENTIAL_FLAG = re.compile(
    r"--(?:token|password|passwd|api-key|apikey|secret)(?:=|\s+)(['\"]?)(?![$'\"\s-])[^\s'\";]+", re.IGNORECASE
)
MIN_SECRET_LENGTH = 4


def lint_script(script: str, secrets: Iterable[str] = ()) -> list[str]:
    """Findings (empty = clean). A finding names the line and the kind, never the secret itself."""
    findings: list[str] = []
    known = [s for s in dict.fromkeys(secrets) if isinstance(s, str) and len(s) >= MIN_SECRET_LENGTH]
    short = [s for s in dict.fromkeys(secrets) if isinstance(s, str) and 0 < len(s) < MIN_SECRET_LENGTH]
    if short:
        findings.append(
            f"{len(short)} known secret value(s) are shorter than {MIN_SECRET_LENGTH} characters and cannot be "
            "checked reliably; use real credentials"
        )
    for number, line in enumerate(script.splitlines(), start=1):
        for index, secret in enumerate(known, start=1):
            if secret in line:
                findings.append(f"line {number}: contains known secret value #{index}")
        for kind, pattern in _TOKEN_PATTERNS:
            if pattern.search(line):
                findings.append(f"line {number}: looks like a {kind}")
        for m in _CREDENTIAL_ASSIGNMENT.finditer(line):
            findings.append(f"line {number}: credential-like assignment {m.group(1)}=<literal value>")
        if _CREDENTIAL_FLAG.search(line):
            findings.append(f"line {number}: credential-like command-line flag with a literal value")
    return findings


def assert_script_clean(script: str, secrets: Iterable[str] = ()) -> None:
    """Raise NpaValidationError listing every lint finding."""
    findings = lint_script(script, secrets)
    if findings:
        raise NpaValidationError(
            "the sbatch script would carry credentials; pass secrets through the sidecar env file instead:\n  "
            + "\n  ".join(findings)
        )


def bash_syntax_check(script: str, timeout: float = 30) -> None:
    """``bash -n`` on the script (stdin, never a file); raise NpaValidationError with bash's message."""
    try:
        proc = subprocess.run(["bash", "-n"], input=script.encode(), capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:  # pragma: no cover - bash is part of every supported platform
        raise NpaValidationError("bash is not installed on this machine; cannot syntax-check the script") from exc
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip().replace("bash: ", "")
        raise NpaValidationError(f"the sbatch script is not valid bash (bash -n): {message}")


def check_script_size(script: str, limit: int = MAX_SCRIPT_BYTES) -> None:
    """Refuse before staging a script slurmctld would refuse as "too long" (max_script_size, 4 MB by default)."""
    size = len(script.encode("utf-8"))
    if size > limit:
        raise NpaValidationError(
            f"the rendered batch script is {size} bytes; Slurm refuses scripts above {limit} bytes "
            "(SchedulerParameters=max_script_size, 4 MB by default). Move large values (environment, commands) "
            "into files on shared storage; nothing was written or submitted."
        )
