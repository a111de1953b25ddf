"""The read-only checks before a job is submitted, as ONE batched round trip (pure builders and parsers).

Before anything is written, an operator reads what it needs to refuse a job that could never work: whether its
inputs exist, whether its container image is a .sqsh real Enroot can unpack (images.SQSH_CHECK_FUNCTION: magic,
superblock, full size, no device nodes), and the partitions (and nodes) its request is checked against. Each
is one command of a `commands.build_batch`, so the whole check costs one SSH round trip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from npa_airflow.exceptions import NpaRemoteError
from npa_airflow.slurm import commands
from npa_airflow.slurm.images import SqshCheck, build_sqsh_validate_command, parse_sqsh_validation
from npa_airflow.slurm.staging import EXIT_MISSING_INPUTS, build_stage, parse_stage_output

if TYPE_CHECKING:
    from npa_airflow.slurm.ssh import CommandResult


class Layout(str, Enum):
    """How much of the cluster's layout a request is checked against."""

    NONE = "none"
    PARTITIONS = "partitions"  # the wall time against each partition's MaxTime
    NODES = "nodes"  # also whether the partition's nodes can ever hold the request


@dataclass(frozen=True)
class SubmitChecks:
    """What the batched read answered; a part that was not asked for is empty (None)."""

    exists: Mapping[str, bool] = field(default_factory=dict)
    image: SqshCheck | None = None
    partitions: dict[str, Any] | None = None
    nodes: dict[str, Any] | None = None


def build_submit_checks(
    paths: Sequence[str], image: str | None, layout: Layout, cluster: str | None = None
) -> list[str | list[str]]:
    """The batch's commands, in the order :func:`parse_submit_checks` reads them."""
    argvs: list[str | list[str]] = []
    if layout is not Layout.NONE:
        argvs.append(commands.build_partitions(cluster))
    if layout is Layout.NODES:
        argvs.append(commands.build_scontrol_nodes(cluster))
    if paths:
        argvs.append(build_stage([], required_paths=paths)[0])
    if image is not None:
        argvs.append(build_sqsh_validate_command(image))
    return argvs


def parse_submit_checks(
    results: Sequence[CommandResult], paths: Sequence[str], image: str | None, layout: Layout
) -> SubmitChecks:
    """The answers of :func:`build_submit_checks`' commands; a read that failed raises ``NpaRemoteError``."""
    answers = iter(results)
    partitions = nodes = None
    if layout is not Layout.NONE:
        partitions = commands.parse_partitions(_ok(next(answers), "scontrol show partitions").text)
    if layout is Layout.NODES:
        nodes = commands.parse_scontrol_nodes(_ok(next(answers), "scontrol show nodes").text)
    exists: dict[str, bool] = {}
    if paths:
        result = next(answers)
        if result.returncode not in (0, EXIT_MISSING_INPUTS):
            raise NpaRemoteError(f"checking paths on {result.host} failed: {result.error_text[-1000:]}")
        missing = set(parse_stage_output(result.text).missing)
        exists = {p: p not in missing for p in paths}
    check = parse_sqsh_validation(_ok(next(answers), "the image check").text, image) if image is not None else None
    return SubmitChecks(exists=exists, image=check, partitions=partitions, nodes=nodes)


def _ok(result: CommandResult, what: str) -> CommandResult:
    if result.returncode != 0:
        raise NpaRemoteError(f"{what} failed on {result.host} (exit {result.returncode}): {result.error_text[-1000:]}")
    return result
