"""SlurmHook: every byte that goes to or comes from a Slurm login host passes through here.

One async core (:class:`npa_airflow.slurm.transport.async_hook.AsyncSlurmHook`) on asyncssh, pooled per event loop
(:mod:`npa_airflow.slurm.transport.ssh`). This module adds the sync facade operators use on a worker thread: each sync
method runs its async twin on one private background loop, so a worker's calls share one connection.
"""

from __future__ import annotations

from collections.abc import Collection, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from npa_airflow.common.background_loop import run_sync
from npa_airflow.slurm import commands
from npa_airflow.slurm.submit.staging import StagedFile
from npa_airflow.slurm.transport.async_hook import AsyncSlurmHook
from npa_airflow.slurm.transport.ssh import MAX_CHANNELS_PER_CONNECTION, CommandResult

if TYPE_CHECKING:
    from npa_airflow.slurm.transport.cancels import CancelRequest

__all__ = ["MAX_CHANNELS_PER_CONNECTION", "CommandResult", "SlurmHook", "StagedFile"]

T = TypeVar("T")


class SlurmHook(AsyncSlurmHook):
    """Run Slurm commands on a login host over SSH. Connection type ``slurm``; see the README for its fields."""

    conn_name_attr = "slurm_conn_id"
    default_conn_name = "slurm_default"
    conn_type = "slurm"
    hook_name = "Slurm (SSH login host)"

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_sync(coro)

    def run(self, argv: Sequence[str] | str, **kwargs: Any) -> CommandResult:
        return self._sync(self.arun(argv, **kwargs))

    def stage(self, files: Sequence[StagedFile], **kwargs: Any) -> None:
        self._sync(self.astage(files, **kwargs))

    def stage_and_submit(self, files: Sequence[StagedFile], script_path: str, **kwargs: Any) -> commands.SubmitResult:
        return self._sync(self.astage_and_submit(files, script_path, **kwargs))

    def query_jobs(self, job_ids: Sequence[str], *, pending: Collection[str] = ()) -> commands.JobQuery:
        return self._sync(self.aquery_jobs(job_ids, pending=pending))

    def job_states(self, job_ids: Sequence[str]) -> dict[str, commands.SlurmJobInfo]:
        return self._sync(self.ajob_states(job_ids))

    def cancel(self, job_id: str, **kwargs: Any) -> str:
        return self._sync(self.acancel(job_id, **kwargs))

    def cancel_one(self, request: CancelRequest) -> str:
        return self._sync(self.acancel_one(request))

    def cancel_by_name(self, job_name: str, **kwargs: Any) -> None:
        self._sync(self.acancel_by_name(job_name, **kwargs))

    def cancel_origin(self, job_id: str, marker: str | None) -> commands.CancelOrigin:
        return self._sync(self.acancel_origin(job_id, marker))

    def submit_time(self, job_id: str) -> float | None:
        return self._sync(self.asubmit_time(job_id))

    def tail_logs(self, requests: Sequence[tuple[str, int]], max_bytes: int = 1 << 20) -> list[commands.LogChunk]:
        return self._sync(self.atail_logs(requests, max_bytes))

    def paths_exist(self, paths: Sequence[str]) -> dict[str, bool]:
        return self._sync(self.apaths_exist(paths))

    def path_exists(self, path: str) -> bool:
        return self._sync(self.apath_exists(path))

    def find_jobs_by_name(self, names: Sequence[str]) -> list[commands.SlurmJobInfo]:
        return self._sync(self.afind_jobs_by_name(names))

    def cluster_layout(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self._sync(self.acluster_layout())

    def nodes(self) -> dict[str, Any]:
        return self._sync(self.anodes())

    def partitions(self) -> dict[str, Any]:
        return self._sync(self.apartitions())

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button."""
        try:
            result = self.run(["sinfo", "--version"])
        except Exception as exc:
            return False, str(exc)
        return True, f"{result.host}: {result.text.strip()}"
