"""Burst operators: one gang-scheduled multi-node torchrun job launched through a SkyPilot API server.

``BurstTorchrunOperator`` is the seed's ``npa burst submit``, ``BurstSubmitYamlOperator`` its ``submit-yaml``,
``BurstNcclProbeOperator`` the all-reduce probe before the real job. What they share (launch or adopt, wait,
cancel, teardown, ``max_wait``) is ``BurstLaunchOperatorBase`` in ``burst/base.py``.

Arguments use the vocabulary of both backends (``command``, ``environment``, ``secret_env``, ``max_wait``); the
old names (``entrypoint``, ``envs``, ``secret_conn_ids``, ``deadline``, and ``gpu_per_node`` for
``accelerators``) still work with a DeprecationWarning (``npa_airflow.common.renamed``).

Importing this module is cheap: no httpx, no yaml, no SkyPilot at parse time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from npa_airflow.burst.base import BurstLaunchOperatorBase
from npa_airflow.common.renamed import renamed, require
from npa_airflow.common.secret_env import resolve_secret_env, validate_secret_env
from npa_airflow.exceptions import NpaValidationError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.burst.task import BurstSpec

__all__ = ["BurstLaunchOperatorBase", "BurstNcclProbeOperator", "BurstSubmitYamlOperator", "BurstTorchrunOperator"]


class BurstTorchrunOperator(BurstLaunchOperatorBase):
    """Run ``command`` under torchrun on ``nodes`` nodes, each with the accelerators ``accelerators`` (SkyPilot).

    :param image: container image (a plain reference becomes ``docker:<image>``); torchrun must be in it.
    :param nodes: node count (gang-scheduled: all or nothing).
    :param accelerators: SkyPilot accelerator spec per node, ``NAME:COUNT`` (e.g. ``H100:8``): a GPU type and
        count, unlike Slurm's ``gpus_per_node`` (a count). Old name: ``gpu_per_node``.
    :param command: the single-process training command, run under torchrun on every node (no torchrun, no
        MASTER_ADDR/RANK/...). Old name: ``entrypoint``.
    :param name: job name (default: the task id).
    :param environment: environment for the job (no distributed or registry variables). Old name: ``envs``.
    :param secret_env: ``{ENV_NAME: "conn:CONN_ID[:field]" | "var:NAME"}`` (field default: the password), as on
        Slurm: each value becomes a SkyPilot secret. Old name: ``secret_conn_ids`` (``{ENV_NAME: conn_id}``, the
        connection's password, which is ``"conn:CONN_ID"``).
    :param infra: SkyPilot infra pin, e.g. ``k8s``, ``slurm/<cluster>``, ``aws/us-east-1``.
    :param cluster_name: run on this cluster (kept afterwards if it existed); default a fresh one per try.
    :param workdir: / :param file_mounts: synced to the cluster by SkyPilot.
    :param teardown: ``down`` | ``keep`` | None (down for clusters the task created, else keep).
    :param retry_until_up: keep retrying provisioning until capacity appears.
    :param on_previous_try: a live launch or job of an earlier try is adopted ("reattach") or cancelled ("cancel").
    :param max_wait: seconds (or timedelta) from launch after which the job is cancelled and the task fails.
        Old name: ``deadline``.
    :param registry_conn_id: registry credentials (host = server, login, password) for a private image.
    :param master_port: rendezvous port on the master node.
    """

    template_fields: Sequence[str] = (
        "image",
        "accelerators",
        "command",
        "job_name",
        "environment",
        "infra",
        "cluster_name",
        "workdir",
        "file_mounts",
    )
    template_fields_renderers = {"environment": "json", "file_mounts": "json"}

    def __init__(
        self,
        *,
        image: str | None,
        nodes: int,
        accelerators: str | None = None,
        command: str | None = None,
        name: str | None = None,
        environment: Mapping[str, Any] | None = None,
        secret_env: Mapping[str, str] | None = None,
        infra: str | None = None,
        workdir: str | None = None,
        file_mounts: Mapping[str, str] | None = None,
        master_port: int = 29500,
        gpu_per_node: str | None = None,  # the old names: accelerators, command, environment, secret_env
        entrypoint: str | None = None,
        envs: Mapping[str, Any] | None = None,
        secret_conn_ids: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        owner = f"{type(self).__name__}(task_id={kwargs.get('task_id')!r})"
        defaults = kwargs.get("default_args")
        accelerators = renamed(owner, "accelerators", accelerators, "gpu_per_node", gpu_per_node, defaults)
        command = renamed(owner, "command", command, "entrypoint", entrypoint, defaults)
        environment = renamed(owner, "environment", environment, "envs", envs, defaults)
        secrets = renamed(owner, "secret_env", secret_env, "secret_conn_ids", secret_conn_ids, defaults)
        if secrets is not None and secrets is secret_conn_ids:
            secrets = _conn_ids_as_secret_env(secret_conn_ids)
        super().__init__(**kwargs)
        self.image = image
        self.nodes = nodes
        self.accelerators = require(owner, "accelerators", accelerators)
        self.command = require(owner, "command", command)
        self.job_name = name or self.task_id.replace(".", "-")
        self.environment = dict(environment or {})
        self.secret_env = validate_secret_env(secrets)
        self.infra = infra
        self.workdir = workdir
        self.file_mounts = dict(file_mounts or {})
        self.master_port = master_port

    def spec(self) -> BurstSpec:
        # DAG parse: burst.task is run-time only
        from npa_airflow.burst.task import BurstSpec

        return BurstSpec(
            image=self.image,
            nodes=self.nodes,
            accelerators=self.accelerators,
            command=self.command,
            name=self.job_name,
            environment=self.environment,
            infra=self.infra or None,
            workdir=self.workdir,
            file_mounts=self.file_mounts,
            master_port=self.master_port,
        )

    def _secret_values(self) -> dict[str, str]:
        # DAG parse: burst.task is run-time only
        from npa_airflow.burst.task import validate_envs

        validate_envs(dict.fromkeys(self.secret_env, ""), "secret_env")
        return resolve_secret_env(self.secret_env)

    def build_task_dict(self, context: Context, secrets: dict[str, str]) -> tuple[dict[str, Any], int]:
        # DAG parse: the launcher and burst.task are run-time only
        from npa_airflow.burst.launcher import render_launcher
        from npa_airflow.burst.task import build_task

        spec = self.spec()
        launcher = render_launcher(spec)
        self.log.info("Launcher (the task's run command):\n%s", launcher)
        return build_task(spec, launcher, {**self._secret_values(), **secrets}), spec.nodes


def _conn_ids_as_secret_env(secret_conn_ids: Any) -> dict[str, str]:
    """The old ``secret_conn_ids`` ({ENV_NAME: conn_id}: the connection's password) as ``secret_env``."""
    if not isinstance(secret_conn_ids, Mapping) or not all(isinstance(c, str) for c in secret_conn_ids.values()):
        raise NpaValidationError(f"secret_conn_ids={secret_conn_ids!r} must map ENV_NAME -> connection id")
    return {name: f"conn:{conn_id}" for name, conn_id in secret_conn_ids.items()}


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
        # DAG parse: burst.task is run-time only
        from npa_airflow.burst.task import load_task_yaml, substitute_vars

        path = self._resolve_path(context)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise NpaValidationError(f"yaml_path={self.yaml_path!r}: cannot read {path} ({exc})") from exc
        return substitute_vars(load_task_yaml(text, path), self.vars, path)

    def build_task_dict(self, context: Context, secrets: dict[str, str]) -> tuple[dict[str, Any], int]:
        # DAG parse: burst.task is run-time only
        from npa_airflow.burst.task import DOCKER_LOGIN_VARS, validate_job_name

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

    def __init__(
        self,
        *,
        probe_dir: str | None = None,
        collective_timeout: int = 300,
        environment: Mapping[str, Any] | None = None,
        envs: Mapping[str, Any] | None = None,  # the old name of environment
        **kwargs: Any,
    ) -> None:
        owner = f"{type(self).__name__}(task_id={kwargs.get('task_id')!r})"
        environment = dict(renamed(owner, "environment", environment, "envs", envs, kwargs.get("default_args")) or {})
        environment.setdefault("NPA_PROBE_COLLECTIVE_TIMEOUT", str(int(collective_timeout)))
        if kwargs.get("command") is None and kwargs.get("entrypoint") is None:
            kwargs["command"] = "nccl_allreduce_probe.py"
        if probe_dir is None:
            # DAG parse: the templates module loads only for a probe without probe_dir
            from npa_airflow.common.templates import templates_dir

            probe_dir = str(templates_dir() / "probe")
        super().__init__(workdir=probe_dir, environment=environment, **kwargs)
