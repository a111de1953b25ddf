"""One cluster of one Slurm connection, per event loop: its hook and the batches that are not polling.

Everything a process asks of one cluster goes through its channel: the poller's cycle
(`npa_airflow.slurm.watch.poller`, which takes the channel's hook), the cancels, claim reads and job states of many
triggers' `on_kill` and of the API server's listener (`kills`, `npa_airflow.slurm.transport.kill_batch`), and the
success-marker checks of the jobs that end in one cycle (`path_checks`). Each batch sends one command for what
arrives together (`npa_airflow.common.coalesce`), through the one hook, so one SSH connection.

Channels are keyed by (event loop, connection id, cluster), like the pollers: a triggerer has one per cluster its
jobs' handles record, the API server's background loop one per cluster it cancels on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from npa_airflow.common.coalesce import Coalescer
from npa_airflow.common.per_loop import PerLoop
from npa_airflow.slurm.transport.async_hook import AsyncSlurmHook
from npa_airflow.slurm.transport.kill_batch import KillBatch

__all__ = ["ClusterChannel", "get_channel", "reset_channels"]


class ClusterChannel:
    """The hook of one cluster (None: the connection's) and its batches: kills, claim reads, marker checks.

    A `hook_factory` gets the connection id and must return a hook for this channel's cluster.
    """

    def __init__(
        self, conn_id: str, hook_factory: Callable[[str], Any] | None = None, *, cluster: str | None = None
    ) -> None:
        self.conn_id = conn_id
        self.cluster = cluster
        self._hook_factory = hook_factory or functools.partial(_default_hook_factory, cluster=cluster)
        self._hook: Any = None
        self.kills = KillBatch(lambda: self.hook)  # on_kill's and the listener's reads and cancels, batched
        # Success-marker checks of the jobs that ended in one cycle (a wave of them): one command for all.
        self.path_checks: Coalescer[str, bool] = Coalescer(lambda paths: self.hook.apaths_exist(paths))

    @property
    def hook(self) -> Any:
        """The cluster's hook, made on first use and kept (its pooled SSH connection is the cluster's)."""
        if self._hook is None:
            self._hook = self._hook_factory(self.conn_id)
        return self._hook


def _default_hook_factory(conn_id: str, cluster: str | None = None) -> Any:
    return AsyncSlurmHook(slurm_conn_id=conn_id, cluster=cluster)


_CHANNELS: PerLoop[tuple[str, str | None], ClusterChannel] = PerLoop()  # (connection id, cluster)


def get_channel(
    conn_id: str, hook_factory: Callable[[str], Any] | None = None, *, cluster: str | None = None
) -> ClusterChannel:
    """The channel of `conn_id` and `cluster` (a handle's) on the running event loop (created on first use)."""
    return _CHANNELS.get((conn_id, cluster), lambda: ClusterChannel(conn_id, hook_factory, cluster=cluster))


def reset_channels() -> None:
    """Forget every channel (tests)."""
    _CHANNELS.clear()
