"""Which of the jobs found by a task instance's names are its own (pure).

A new try looks for the jobs of its tries by exact name, restricted to the connection's user. A name is not proof:
a job of the same account can carry it (a second deployment with the same key, a hand-made job), so each job must
also carry its owner's proof (`Deployment.owns`, read back from the comment in the same lookup). Two exceptions,
both bounded:
- accounting without comments (Slurm's default ``AccountingStoreFlags``): a job only sacct reports has an empty
  comment. It is taken as this task's when it has ENDED (reading it changes nothing on the cluster); a live job is
  always in squeue, which shows the comment.
- the naming of releases before the deployment key (no comment at all): a job under an earlier try's old name,
  submitted before this deployment's identity was created (the upgrade), is found once by the next try.
Everything else that holds one of the names is foreign: left alone, and reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from npa_airflow.common.deployment import Deployment
from npa_airflow.slurm.commands import SlurmJobInfo


@dataclass(frozen=True)
class TryNames:
    """The job names of one task instance's tries: this try's, earlier tries' (oldest first), and the earlier tries'
    names under the naming before the deployment key."""

    own: str
    earlier: tuple[str, ...] = ()
    legacy: tuple[str, ...] = ()

    @property
    def all(self) -> list[str]:
        return list(dict.fromkeys([*self.earlier, self.own, *self.legacy]))

    def try_of(self, name: str | None) -> int:
        """The try number a name belongs to (its ``-t<try>``; this try's number for an unknown name)."""
        known = name if name in self.earlier or name in self.legacy else self.own
        number = known.rpartition("-t")[2]
        return int(number) if number.isdigit() else len(self.legacy) + 1


@dataclass(frozen=True)
class Owners:
    """The jobs found by name: this task instance's own, and the others that hold one of its names."""

    owned: tuple[SlurmJobInfo, ...]
    foreign: tuple[SlurmJobInfo, ...]


def sort_by_owner(found: list[SlurmJobInfo], names: TryNames, deployment: Deployment) -> Owners:
    owned, foreign = [], []
    for info in found:
        (owned if _is_owned(info, names, deployment) else foreign).append(info)
    return Owners(tuple(owned), tuple(foreign))


def _is_owned(info: SlurmJobInfo, names: TryNames, deployment: Deployment) -> bool:
    name = info.job_name
    if name == names.own or name in names.earlier:
        if deployment.owns(name, info.comment):
            return True
        return info.comment is None and info.source == "sacct" and info.state.is_terminal
    if name in names.legacy:
        created = deployment.created_at
        return (
            info.comment is None  # those releases gave their jobs no comment
            and created is not None
            and info.submitted_at is not None
            and info.submitted_at < math.floor(created)  # Slurm's times are whole seconds: that second is not before
        )
    return False


def describe_foreign(info: SlurmJobInfo) -> str:
    """One line about a job that holds a task's name without being its own."""
    proof = f"comment {info.comment!r}" if info.comment else "no owner proof"
    return f"Slurm job {info.job_id} ({info.job_name}, {info.native_state}, {proof})"
