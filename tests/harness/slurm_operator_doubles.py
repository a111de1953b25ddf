"""Test doubles for the Slurm job operators: a recording stand-in for SlurmHook (sync facade), a task
instance context (optionally with a task state store), and the connection the unit tests use."""

from __future__ import annotations

import json
import types
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import CancelOrigin, LogChunk, NodeInfo, PartitionInfo, SlurmJobInfo
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.operators import SlurmSubmitOperator
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from npa_airflow.slurm.triggers import SlurmJobTrigger
from tests.harness.airflow_tasks import job_name as job_name_for

CONN = {
    "conn_type": "slurm",
    "host": "127.0.0.1",
    "port": 2222,
    "login": "npa",
    "extra": {"results_root": "/shared/results", "partition": "cpu", "insecure_skip_host_key_check": True},
}


# What SlurmHook.config reads from CONN (the connection `slurm_unit`).
UNIT_CONFIG = SlurmConnectionConfig(
    conn_id="slurm_unit",
    hosts=(("127.0.0.1", 2222),),
    user="npa",
    insecure_skip_host_key_check=True,
    partition="cpu",
    results_root="/shared/results",
)

_OWN = object()


def job(job_id: str, name: str, state: JobState, native: str | None = None, comment=_OWN, **kw) -> SlurmJobInfo:
    """A job a name lookup finds; by default it carries this deployment's owner proof (what our tries submit)."""
    from npa_airflow.common.deployment import current_deployment

    return SlurmJobInfo(
        job_id=job_id,
        native_state=native or state.value,
        state=state,
        exit_code=kw.get("exit_code"),
        signal=None,
        job_name=name,
        node_list=kw.get("node_list", "c1"),
        reason=None,
        source=kw.get("source", "sacct"),
        comment=current_deployment().owner_comment(name, None) if comment is _OWN else comment,
        submitted_at=kw.get("submitted_at"),
    )


@dataclass
class HookDouble:
    """Test double for SlurmHook (sync facade)."""

    existing: list[SlurmJobInfo] = field(default_factory=list)
    submit_outcomes: list[object] = field(default_factory=list)  # SubmitResult or an exception to raise
    appear_after_ambiguous: list[SlurmJobInfo] = field(default_factory=list)
    missing_paths: set[str] = field(default_factory=set)
    node_records: dict[str, NodeInfo] = field(
        default_factory=lambda: {
            n: NodeInfo(n, "IDLE", ("cpu",), None, gpus=0, real_memory_mb=4096) for n in ("c1", "c2")
        }
    )
    partition_records: dict[str, PartitionInfo] = field(
        default_factory=lambda: {
            "cpu": PartitionInfo(
                name="cpu", max_time_minutes=120, default=True, state="UP", nodes="c[1-2]", total_nodes=2
            )
        }
    )
    calls: list[tuple] = field(default_factory=list)
    cancelled_by_airflow: set[str] = field(default_factory=set)  # job ids whose cancel marker exists
    cancel_by_name_comments: list[str] = field(default_factory=list)
    cancel_names: dict[str, str | None] = field(default_factory=dict)  # job id -> the name its cancel expected
    submit_times: dict[str, float] = field(default_factory=dict)  # Slurm's submit time of existing jobs
    config: SlurmConnectionConfig = field(default_factory=lambda: UNIT_CONFIG)  # a real hook's: the connection's

    def find_jobs_by_name(self, names):
        self.calls.append(("find", tuple(names)))
        return [j for j in self.existing if j.job_name in names]

    def cancel_one(self, request):
        self.calls.append(("cancel", request.job_id))
        self.cancel_names[request.job_id] = request.job_name
        if request.shred:
            self.calls.append(("shred", request.shred))
        if request.marker:
            self.cancelled_by_airflow.add(request.job_id)
        return "cancelled"

    def cancel_by_name(self, job_name, *, comment, marker=None, shred=()):
        self.calls.append(("cancel_by_name", job_name, marker))
        self.cancel_by_name_comments.append(comment)

    def cancel_origin(self, job_id, marker):
        self.calls.append(("cancel_origin", job_id))
        if job_id in self.cancelled_by_airflow:
            return CancelOrigin(by_airflow=True, state="CANCELLED by 1000", uid="1000", user="npa")
        return CancelOrigin(by_airflow=False, state="CANCELLED by 0", uid="0", user="root")

    def submit_time(self, job_id):
        return self.submit_times.get(job_id)

    def run(self, command, **kwargs):
        self.calls.append(("run", command))

    def stage_and_submit(self, files, script_path, **kwargs):
        self.calls.append(("submit", script_path, tuple(f.path for f in files), kwargs))
        outcome = self.submit_outcomes.pop(0)
        if isinstance(outcome, Exception):
            self.existing.extend(self.appear_after_ambiguous)
            raise outcome
        return outcome

    def partitions(self):
        self.calls.append(("partitions",))
        return dict(self.partition_records)

    def nodes(self):
        return dict(self.node_records)

    def cluster_layout(self):
        self.calls.append(("partitions",))  # the same read as partitions(), with the nodes
        return dict(self.partition_records), dict(self.node_records)

    def paths_exist(self, paths):
        self.calls.append(("paths_exist", tuple(paths)))
        return {p: p not in self.missing_paths for p in paths}

    def tail_logs(self, requests, max_bytes=1 << 20):
        return [
            LogChunk(path=p, data=b"Traceback\nValueError: bad config\n"[-max_bytes:], offset=o, size=40)
            for p, o in requests
        ]


def context(try_number: int = 1, map_index: int = -1, task_state_store: Any = None):
    ti = types.SimpleNamespace(
        id=uuid.uuid4(),
        dag_id="train_dag",
        task_id="train",
        run_id="manual__2026-12-02",
        map_index=map_index,
        try_number=try_number,
        pushed={},
    )
    ti.xcom_push = lambda key, value: ti.pushed.__setitem__(key, value)
    ctx: dict[str, Any] = {"ti": ti}
    if task_state_store is not None:
        ctx["task_state_store"] = task_state_store
    return ctx


def make_op(hook: HookDouble, **kwargs) -> SlurmSubmitOperator:
    defaults = dict(
        task_id="train",
        slurm_conn_id="slurm_unit",
        command="echo hello",
        gpus_per_node=0,
        cpus_per_task=1,
        time_hours=0.1,
        partition="cpu",
    )
    defaults.update(kwargs)
    op = SlurmSubmitOperator(**defaults)
    op.get_hook = lambda: hook
    return op


def name(try_number: int) -> str:
    return job_name_for("train_dag", "train", "manual__2026-12-02", -1, try_number)


def legacy_name(try_number: int) -> str:
    """The name the release before the deployment key gave that try."""
    from npa_airflow.common.naming import legacy_job_name_for

    return legacy_job_name_for("train_dag", "train", "manual__2026-12-02", -1, try_number)


def install_unit_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection `slurm_unit` (from the environment) and a short reconcile window."""
    from npa_airflow.slurm.operators import submission

    monkeypatch.setenv("AIRFLOW_CONN_SLURM_UNIT", json.dumps(CONN))
    monkeypatch.setattr(submission, "RECONCILE_WINDOW_SECONDS", 0.05)
    monkeypatch.setattr(submission, "RECONCILE_POLL_SECONDS", 0.01)


class TaskStateStoreDouble:
    """Stands in for `context["task_state_store"]` (Airflow 3.3): a dict shared by every try of one task instance."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        if value is None:
            raise ValueError("Cannot set value as None")
        self.values[key] = json.loads(json.dumps(value))  # stored as JSON, like the real store

    def delete(self, key: str) -> None:
        self.values.pop(key, None)


def run_execute(op: SlurmSubmitOperator, ctx) -> SlurmJobTrigger:
    op.render_template_fields(ctx)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return deferred.value.trigger


def handle_dict(job_id="101"):
    return {
        "conn_id": "slurm_unit",
        "cluster": None,
        "job_id": job_id,
        "job_name": name(1),
        "login_host": "127.0.0.1:2222",
        "results_dir": f"/shared/results/{name(1)}",
        "stdout_path": f"/shared/results/slurm-logs/{name(1)}/main.out",
        "stderr_path": f"/shared/results/slurm-logs/{name(1)}/main.err",
        "try_number": 1,
        "retry_of": None,
        "submitted_at": 1.0,
        "script_path": f"/shared/results/sbatch/{name(1)}.sbatch",
    }


# A connection with every extra set (GPU and CPU partitions, results root, .sqsh cache).
CFG_WITH_EXTRAS = SlurmConnectionConfig(
    conn_id="slurm_default",
    hosts=(("login1", 22),),
    user="npa",
    insecure_skip_host_key_check=True,
    partition="gpu",
    cpu_partition="cpu_long",
    results_root="/lustre/results",
    sqsh_cache_dir="/lustre/sqsh",
)


def sqsh_convert_handle() -> SlurmJobHandle:
    """The handle of a .sqsh conversion job (job 42) on the CFG_WITH_EXTRAS connection."""
    return SlurmJobHandle(
        conn_id="slurm_default",
        cluster=None,
        job_id="42",
        job_name="npa-x-0123456789-t1",
        login_host="login1:22",
        results_dir="/lustre/sqsh",
        stdout_path="/lustre/results/slurm-logs/x.out",
        stderr_path="/lustre/results/slurm-logs/x.err",
        try_number=1,
        retry_of=None,
        submitted_at=1.0,
    )
