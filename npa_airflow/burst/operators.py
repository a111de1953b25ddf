"""Burst operators: one gang-scheduled multi-node torchrun job launched through a SkyPilot API server.

``BurstTorchrunOperator`` is the seed's ``npa burst submit``; ``BurstSubmitYamlOperator`` its
``submit-yaml``. Both validate everything before the first request, launch from the worker, push the job
handle to XCom (key ``burst_job``), then wait in the triggerer (``BurstJobTrigger``) or, when not
deferrable, on the worker with the same code. Kill -> cancel the launch/job and apply the teardown
policy (``down`` for clusters the task created, ``keep`` for a pinned cluster that already existed).

A try first looks for what earlier tries left, by their names (``burst.adoption``): a live launch or job is
adopted (``on_previous_try="reattach"``) or cancelled (``"cancel"``), never launched beside. The outcome follows
the Slurm side: a job that failed by itself fails the task without a retry (``AirflowFailException``, with the end
of its log); a failed launch, a lost cluster or infrastructure evidence in the log is retried; a wait that could
not learn the job's end (API server unreachable past its budget) is retried and leaves job and cluster running
for the next try. The teardown policy applies only when the job ended, was cancelled, or the deadline passed.

Importing this module is cheap: no httpx, no yaml, no SkyPilot at parse time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from npa_airflow.burst.adoption import AdoptOrLaunchMixin
from npa_airflow.common import xcom_keys
from npa_airflow.common.defaults import default_deferrable
from npa_airflow.common.links import BurstJobLink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.hook import SkyPilotHook


def _seconds(value: timedelta | float | int | None, field: str) -> float | None:
    from npa_airflow.exceptions import NpaValidationError

    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise NpaValidationError(f"{field}={value!r}: give a positive number of seconds or a timedelta")
    return float(seconds)


class BurstLaunchOperatorBase(AdoptOrLaunchMixin, BaseOperator):
    """Launch (or adopt an earlier try's launch), wait, cancel and tear down; subclasses say what task to launch
    (``build_task_dict``)."""

    operator_extra_links = (BurstJobLink(),)
    ui_color = "#d7ecff"

    def __init__(
        self,
        *,
        skypilot_conn_id: str = "skypilot_default",
        cluster_name: str | None = None,
        teardown: str | None = None,
        retry_until_up: bool = False,
        on_previous_try: str = "reattach",
        deadline: timedelta | float | None = None,
        poll_interval: float = 15.0,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        registry_conn_id: str | None = None,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        from npa_airflow.common.naming import ON_PREVIOUS_TRY
        from npa_airflow.exceptions import NpaValidationError

        if on_previous_try not in ON_PREVIOUS_TRY:
            raise NpaValidationError(
                f"on_previous_try={on_previous_try!r} must be one of {ON_PREVIOUS_TRY} "
                "(adopt the earlier try's live launch or job, or cancel it before launching a new one)"
            )
        self.on_previous_try = on_previous_try
        self.skypilot_conn_id = skypilot_conn_id
        self.cluster_name = cluster_name
        self.teardown = teardown
        self.retry_until_up = retry_until_up
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.stream_logs = stream_logs
        self.cancel_on_kill = cancel_on_kill
        self.registry_conn_id = registry_conn_id
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self._handle: BurstJobHandle | None = None
        self._finished = False

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """Airflow's fields, the connection and the pinned cluster: the API server acts on this task's launch with
        what the serialized DAG names, never with what a handle read back from XCom names (npa_airflow.plugin)."""
        return frozenset(super().get_serialized_fields() | {"skypilot_conn_id", "cluster_name"})

    def linked_job(self) -> dict[str, Any] | None:
        """The handle of the launch this try has (the "SkyPilot cluster" link), None before or without one."""
        return self._handle.to_dict() if self._handle is not None else None

    # -- what to launch (subclasses) ---------------------------------------------------------------------

    def build_task_dict(self, context: Context, secrets: dict[str, str]) -> tuple[dict[str, Any], int]:
        """The SkyPilot task dict (with ``secrets`` merged) and its node count."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------------------

    def get_hook(self) -> SkyPilotHook:
        from npa_airflow.burst.hook import SkyPilotHook

        return SkyPilotHook(self.skypilot_conn_id)

    def registry_secrets(self) -> dict[str, str]:
        """SKYPILOT_DOCKER_* from the explicit registry connection only (never from the environment)."""
        if not self.registry_conn_id:
            return {}
        from npa_airflow.burst.task import docker_login_secrets

        conn = self.get_hook().get_connection(self.registry_conn_id)
        server = conn.host or (conn.extra_dejson or {}).get("server")
        return docker_login_secrets(server, conn.login, conn.password)

    def _teardown_for(self, created: bool) -> str:
        from npa_airflow.burst.task import TEARDOWN_POLICIES
        from npa_airflow.exceptions import NpaValidationError

        if self.teardown is None:
            return "down" if created else "keep"
        if self.teardown not in TEARDOWN_POLICIES:
            raise NpaValidationError(f"teardown={self.teardown!r}: use one of {TEARDOWN_POLICIES} (or None)")
        return self.teardown

    def execute(self, context: Context) -> Any:
        # Everything that can be wrong with the input fails here, before the first request.
        deadline_s = _seconds(self.deadline, "deadline")
        poll = _seconds(self.poll_interval, "poll_interval") or 15.0
        self._teardown_for(True)
        secrets = self.registry_secrets()
        task, nodes = self.build_task_dict(context, secrets)
        self.try_refs(context)  # the cluster name is valid
        hook = self.get_hook()
        handle = self.adopt_or_launch(hook, context, task, nodes)
        # An adopted launch keeps its first submission time: the deadline counts from there.
        deadline = None if deadline_s is None else (handle.submitted_at or time.time()) + deadline_s
        if self.deferrable:
            from npa_airflow.burst.triggers import BurstJobTrigger

            trigger = BurstJobTrigger(
                handle=handle.to_dict(),
                poll_interval=poll,
                deadline=deadline,
                stream_logs=self.stream_logs,
                cancel_on_kill=self.cancel_on_kill,
                nodes=nodes,
            )
            self.defer(trigger=trigger, method_name="execute_complete")
        return self.execute_complete(context, self._wait_here(hook, handle, poll, deadline, nodes))

    def _wait_here(
        self, hook: SkyPilotHook, handle: BurstJobHandle, poll: float, deadline: float | None, nodes: int
    ) -> dict[str, Any]:
        import asyncio

        from npa_airflow.burst.watch import watch_job

        def remember(current: BurstJobHandle) -> None:
            self._handle = current

        async def wait() -> dict[str, Any]:
            async with hook:
                return await watch_job(
                    hook,
                    handle,
                    poll_interval=poll,
                    deadline=deadline,
                    stream_logs=self.stream_logs,
                    log=self.log,
                    nodes=nodes,
                    on_job_id=remember,
                )

        return asyncio.run(wait())

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Turn the wait's event into the task's outcome (the Slurm side's: a program failure is not retried)."""
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from npa_airflow.burst.watch import event_handle, validate_event

        event = validate_event(event)
        status, handle, message = event["status"], event_handle(event), str(event["message"])
        self._handle = handle
        context["ti"].xcom_push(key=xcom_keys.BURST_JOB, value=handle.to_dict())
        job = f"burst job {handle.name} on cluster {handle.cluster}"
        if status == "interrupted":  # the job's end is unknown: leave it and its cluster to the next try
            self._finished = True
            raise AirflowException(
                f"{job}: {message}. The job and its cluster were left as they are: the next try adopts them "
                f"(on_previous_try='reattach') or cancels them ('cancel'); to stop them by hand, run "
                f"`sky down {handle.cluster}` against {handle.endpoint}"
            )
        if status == "canceled" and handle.try_name not in (None, self.try_refs(context)[-1].try_name):
            # An adopted launch of an earlier try was cancelled: that try was cleared, which means "run again".
            self.log.warning("The adopted %s of an earlier try was cancelled (task cleared); launching anew", job)
            return self.execute(context)
        tail = self._log_tail(handle) if status == "failed" else ""  # read before the teardown takes it away
        # A deadline still has a live launch or job: cancel it; every ending applies the teardown policy.
        self._cancel_and_teardown(handle, cancel=status == "deadline")
        self._finished = True
        if status == "success":
            self.log.info("%s", message)
            return handle.to_dict()
        if status == "deadline":
            raise AirflowException(
                f"{job}: {message}; the author-set deadline of {self.deadline} passed, so it was cancelled "
                f"(teardown={handle.teardown})"
            )
        if status == "canceled":
            raise AirflowFailException(f"{job} was cancelled outside Airflow ({message}); not retried")
        return self._fail(handle, event, message, tail)

    def _fail(self, handle: BurstJobHandle, event: dict[str, Any], message: str, tail: str) -> Any:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from npa_airflow.burst.outcome import classify_burst_failure

        verdict = classify_burst_failure(event.get("native_state"), message, tail)
        shown = f"\n--- last lines of the job's output ---\n{tail}" if tail else ""
        if verdict.is_infra:
            raise AirflowException(
                f"burst job {handle.name} failed for an infrastructure reason ({verdict.evidence}){shown}"
            )
        raise AirflowFailException(f"{message}: a program failure, not retried.{shown}")

    def _log_tail(self, handle: BurstJobHandle) -> str:
        from npa_airflow.burst.outcome import read_log_tail

        with self.get_hook() as hook:
            return read_log_tail(hook, handle, self.log)

    def _cancel_and_teardown(self, handle: BurstJobHandle, *, cancel: bool) -> None:
        with self.get_hook() as hook:
            hook.cancel_and_teardown(handle, self.log, cancel=cancel, teardown=True)

    def on_kill(self) -> None:
        """The worker is killing the task (non-deferrable wait, or before deferring): cancel and tear down."""
        handle = self._handle
        if handle is None or self._finished or not self.cancel_on_kill:
            return
        self._finished = True
        try:
            self._cancel_and_teardown(handle, cancel=True)
        except Exception:
            self.log.exception("Cancelling burst job %s failed", handle.to_json())


class BurstTorchrunOperator(BurstLaunchOperatorBase):
    """Run ``entrypoint`` under torchrun on ``nodes`` nodes with ``gpu_per_node`` GPUs each (SkyPilot).

    :param image: container image (a plain reference becomes ``docker:<image>``); torchrun must be in it.
    :param nodes: node count (gang-scheduled: all or nothing).
    :param gpu_per_node: SkyPilot accelerator spec per node, ``NAME:COUNT`` (e.g. ``H100:8``).
    :param entrypoint: the single-process training command (no torchrun, no MASTER_ADDR/RANK/...).
    :param name: job name (default: the task id).
    :param envs: environment for the job (no distributed or registry variables).
    :param secret_conn_ids: ``{ENV_NAME: conn_id}``: the connection's password becomes a SkyPilot secret.
    :param infra: SkyPilot infra pin, e.g. ``k8s``, ``slurm/<cluster>``, ``aws/us-east-1``.
    :param cluster_name: run on this cluster (kept afterwards if it existed); default a fresh one per try.
    :param workdir: / :param file_mounts: synced to the cluster by SkyPilot.
    :param teardown: ``down`` | ``keep`` | None (down for clusters the task created, else keep).
    :param retry_until_up: keep retrying provisioning until capacity appears.
    :param on_previous_try: a live launch or job of an earlier try is adopted ("reattach") or cancelled ("cancel").
    :param deadline: seconds (or timedelta) from launch after which the job is cancelled and the task fails.
    :param registry_conn_id: registry credentials (host = server, login, password) for a private image.
    :param master_port: rendezvous port on the master node.
    """

    template_fields: Sequence[str] = (
        "image",
        "gpu_per_node",
        "entrypoint",
        "job_name",
        "envs",
        "infra",
        "cluster_name",
        "workdir",
        "file_mounts",
    )
    template_fields_renderers = {"envs": "json", "file_mounts": "json"}

    def __init__(
        self,
        *,
        image: str,
        nodes: int,
        gpu_per_node: str,
        entrypoint: str,
        name: str | None = None,
        envs: Mapping[str, Any] | None = None,
        secret_conn_ids: Mapping[str, str] | None = None,
        infra: str | None = None,
        workdir: str | None = None,
        file_mounts: Mapping[str, str] | None = None,
        master_port: int = 29500,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.image = image
        self.nodes = nodes
        self.gpu_per_node = gpu_per_node
        self.entrypoint = entrypoint
        self.job_name = name or self.task_id.replace(".", "-")
        self.envs = dict(envs or {})
        self.secret_conn_ids = dict(secret_conn_ids or {})
        self.infra = infra
        self.workdir = workdir
        self.file_mounts = dict(file_mounts or {})
        self.master_port = master_port

    def spec(self):
        from npa_airflow.burst.task import BurstSpec

        return BurstSpec(
            image=self.image,
            nodes=self.nodes,
            gpu_per_node=self.gpu_per_node,
            entrypoint=self.entrypoint,
            name=self.job_name,
            envs=self.envs,
            infra=self.infra or None,
            workdir=self.workdir,
            file_mounts=self.file_mounts,
            master_port=self.master_port,
        )

    def _secret_values(self) -> dict[str, str]:
        from npa_airflow.burst.task import validate_envs
        from npa_airflow.exceptions import NpaValidationError

        validate_envs(dict.fromkeys(self.secret_conn_ids, ""), "secret_conn_ids")
        secrets = {}
        for env_name, conn_id in self.secret_conn_ids.items():
            password = self.get_hook().get_connection(conn_id).password
            if not password:
                raise NpaValidationError(f"secret_conn_ids[{env_name!r}]: connection {conn_id!r} has no password")
            secrets[env_name] = password
        return secrets

    def build_task_dict(self, context: Context, secrets: dict[str, str]) -> tuple[dict[str, Any], int]:
        from npa_airflow.burst.launcher import render_launcher
        from npa_airflow.burst.task import build_task

        spec = self.spec()
        launcher = render_launcher(spec)
        self.log.info("Launcher (the task's run command):\n%s", launcher)
        return build_task(spec, launcher, {**self._secret_values(), **secrets}), spec.nodes


class BurstSubmitYamlOperator(BurstLaunchOperatorBase):
    """Launch one SkyPilot task YAML with ``${VAR}`` placeholders filled from ``vars``.

    :param yaml_path: path to the task YAML (absolute, or relative to the DAG file's folder).
    :param vars: ``{NAME: value}`` for every ``${NAME}``; unresolved placeholders are refused before any
        request (SkyPilot's runtime ``${SKYPILOT_...}`` variables stay for bash).
    :param name: job name; default the task name in the YAML.
    """

    template_fields: Sequence[str] = ("yaml_path", "vars", "job_name", "cluster_name")
    template_fields_renderers = {"vars": "json"}

    def __init__(
        self, *, yaml_path: str, vars: Mapping[str, Any] | None = None, name: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.yaml_path = yaml_path
        self.vars = dict(vars or {})
        self.job_name = name

    def _resolve_path(self, context: Context) -> str:
        path = os.path.expanduser(self.yaml_path)
        if not os.path.isabs(path):
            dag = context.get("dag") if hasattr(context, "get") else None
            fileloc = getattr(dag, "fileloc", None) or getattr(self.dag, "fileloc", None)
            if fileloc:
                path = os.path.join(os.path.dirname(fileloc), path)
        return path

    def load_task(self, context: Context) -> dict[str, Any]:
        from npa_airflow.burst.task import load_task_yaml, substitute_vars
        from npa_airflow.exceptions import NpaValidationError

        path = self._resolve_path(context)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise NpaValidationError(f"yaml_path={self.yaml_path!r}: cannot read {path} ({exc})") from exc
        return substitute_vars(load_task_yaml(text, path), self.vars, path)

    def build_task_dict(self, context: Context, secrets: dict[str, str]) -> tuple[dict[str, Any], int]:
        from npa_airflow.burst.task import DOCKER_LOGIN_VARS, validate_job_name
        from npa_airflow.exceptions import NpaValidationError

        task = self.load_task(context)
        for section in ("envs", "secrets"):
            values = task.get(section) or {}
            if not isinstance(values, dict):
                raise NpaValidationError(f"{self.yaml_path}: '{section}:' must be a mapping")
            leaked = sorted(set(values) & set(DOCKER_LOGIN_VARS))
            if leaked:
                raise NpaValidationError(
                    f"{self.yaml_path}: sets {leaked} in '{section}:'; registry credentials come only from "
                    "registry_conn_id"
                )
        name = self.job_name or task.get("name")
        if not name:
            raise NpaValidationError(f"{self.yaml_path}: the task has no 'name:'; pass name=")
        task["name"] = validate_job_name(str(name), "name (from the YAML's 'name:' or name=)")
        if secrets:
            task["secrets"] = {**(task.get("secrets") or {}), **secrets}
        nodes = task.get("num_nodes", 1)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise NpaValidationError(f"{self.yaml_path}: num_nodes={nodes!r} must be a whole number >= 1")
        return task, nodes


class BurstNcclProbeOperator(BurstTorchrunOperator):
    """Run the all-reduce probe (the Slurm side's ``templates/probe/nccl_allreduce_probe.py``) on the N nodes
    of a burst cluster, under the same launcher, before the real job: a broken fabric fails this cheap task.

    NCCL when the nodes have CUDA, gloo otherwise; rank 0 prints ``NCCL_PROBE_OK world_size=<n> ...`` and any
    failure exits non-zero. The probe directory is synced as the job's workdir, so it must exist on the API
    server's filesystem (it does when the provider is installed next to the server); pass ``probe_dir``
    otherwise. Pin ``cluster_name`` and ``teardown="keep"`` to probe the cluster the real job will use.
    """

    def __init__(self, *, probe_dir: str | None = None, collective_timeout: int = 300, **kwargs: Any) -> None:
        kwargs.setdefault("entrypoint", "nccl_allreduce_probe.py")
        envs = dict(kwargs.pop("envs", None) or {})
        envs.setdefault("NPA_PROBE_COLLECTIVE_TIMEOUT", str(int(collective_timeout)))
        if probe_dir is None:
            from npa_airflow.common.templates import templates_dir

            probe_dir = str(templates_dir() / "probe")
        super().__init__(workdir=probe_dir, envs=envs, **kwargs)
