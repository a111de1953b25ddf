"""Tasks that run before a GPU job so it never wastes its allocation.

- `SlurmPreflightOperator`: one read-only SSH round trip checks tools, Pyxis/Enroot, storage, datasets and
  partitions; each failure names what is missing and what to do. Nothing is written or submitted.
- `SlurmEnrootCredentialsOperator`: installs registry credentials in Enroot's credentials file (mode 600) from
  an Airflow connection; the secret travels on SSH stdin only.
- `SlurmSqshConvertOperator`: reuses a valid cached .sqsh, otherwise converts the image ONCE as a CPU Slurm
  job (waited on deferrably) and returns the .sqsh path. A failed conversion fails the task: there is no
  fallback to a registry image.
- `SlurmNcclProbeOperator`: a 2-node all-reduce under the container's torchrun; on a hang, the next knob set;
  the working environment is cached per cluster and partition and returned for the submit task.

Heavy imports (asyncssh through the hook) happen inside methods: importing this module in a DAG is cheap.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import PreparedJob, SlurmJobOperatorBase

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.slurm.connection import SlurmConnectionConfig
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.images import ImageRef, SqshCheck

# Defaults, kept literal so a DAG file does not import the builders (equal to enroot.DEFAULT_CONVERT_* and
# probe.DEFAULT_*; a unit test holds them together). The conversion profile is the seed's.
DEFAULT_CONVERT_CPUS = 4
DEFAULT_CONVERT_MEM = "7200M"
MIN_CONVERT_MINUTES = 120
DEFAULT_SOCKET_IFNAME = "eth0"
DEFAULT_TIMEOUT_SECONDS = 120
PREFLIGHT_ATTEMPTS = 3  # only a controller that does not answer is asked again
PREFLIGHT_RETRY_SECONDS = 5.0


def _fail(message: str) -> Exception:
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(message)


def _results_root(cfg: SlurmConnectionConfig, override: str | None, conn_id: str) -> str:
    from npa_airflow.slurm.spec import normalize_storage_path

    root = override or cfg.results_root
    if not root:
        raise NpaValidationError(
            f"results_root is not set and connection {conn_id!r} has no results_root extra: set one of them to an "
            "absolute path on the cluster's shared storage"
        )
    return normalize_storage_path(root, "results_root").rstrip("/")


def check_sqsh(hook: SlurmHook, path: str) -> SqshCheck:
    """Validate a .sqsh on shared storage from the login host (hsqs magic, unsquashfs -s, full size)."""
    from npa_airflow.slurm.images import build_sqsh_validate_command, parse_sqsh_validation

    result = hook.run(build_sqsh_validate_command(path), check=True)
    return parse_sqsh_validation(result.text, path)


# --- preflight -------------------------------------------------------------------------------------------


class SlurmPreflightOperator(BaseOperator):
    """Check the cluster before anything is staged or submitted (one SSH round trip, read-only).

    :param dataset_paths: inputs the run reads (``lustre:///abs`` or absolute shared paths): each must exist.
    :param partitions: partitions the pipeline uses (default: the connection's GPU and CPU partitions).
    :param time_hours: wall time the training job asks for; each partition's MaxTime must allow it.
    :param containers: the pipeline runs in Pyxis containers: check ``srun --container-image`` and Enroot.
    :param check_enroot: check ``enroot`` on the login host (default: same as ``containers``).
    :param results_root: must be a writable directory (default: the connection's).
    :param check_sqsh_cache: the connection's ``sqsh_cache_dir`` must be writable (default: ``containers``).
    """

    template_fields: Sequence[str] = ("dataset_paths", "partitions", "results_root")
    ui_color = "#e8f4e8"

    def __init__(
        self,
        *,
        slurm_conn_id: str = "slurm_default",
        dataset_paths: Sequence[str] = (),
        partitions: Sequence[str] | None = None,
        time_hours: float | None = None,
        containers: bool = True,
        check_enroot: bool | None = None,
        results_root: str | None = None,
        check_sqsh_cache: bool | None = None,
        tools: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if time_hours is not None and (isinstance(time_hours, bool) or not 0 < float(time_hours) <= 24 * 365):
            raise NpaValidationError(f"time_hours={time_hours!r} must be a positive number of hours")
        self.slurm_conn_id = slurm_conn_id
        self.dataset_paths = [dataset_paths] if isinstance(dataset_paths, str) else list(dataset_paths)
        self.partitions = list(partitions) if partitions is not None else None
        self.time_hours = time_hours
        self.containers = containers
        self.check_enroot = containers if check_enroot is None else check_enroot
        self.results_root = results_root
        self.check_sqsh_cache = containers if check_sqsh_cache is None else check_sqsh_cache
        self.tools = tuple(tools) if tools is not None else None

    def build_request(self, cfg: SlurmConnectionConfig) -> Any:
        from npa_airflow.slurm.preflight import SLURM_TOOLS, PreflightRequest

        writable = [("results_root", _results_root(cfg, self.results_root, self.slurm_conn_id))]
        if self.check_sqsh_cache:
            if not cfg.sqsh_cache_dir:
                raise NpaValidationError(
                    f"connection {self.slurm_conn_id!r} has no sqsh_cache_dir extra: set it to a shared directory "
                    "for converted images (or pass check_sqsh_cache=False)"
                )
            writable.append(("sqsh_cache_dir", cfg.sqsh_cache_dir))
        partitions = self.partitions
        if partitions is None:
            partitions = [p for p in (cfg.partition, cfg.cpu_partition if self.containers else None) if p]
        minutes = None if self.time_hours is None else int(-(-float(self.time_hours) * 60 // 1))
        return PreflightRequest(
            tools=self.tools if self.tools is not None else SLURM_TOOLS,
            check_pyxis=self.containers,
            check_enroot=self.check_enroot,
            writable_dirs=tuple(writable),
            dataset_paths=tuple(self.dataset_paths),
            partitions=tuple(dict.fromkeys(partitions)),
            time_minutes=minutes,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        from npa_airflow.slurm.hook import SlurmHook
        from npa_airflow.slurm.preflight import build_preflight_command, parse_preflight

        hook = SlurmHook(self.slurm_conn_id)
        cfg = hook.config
        request = self.build_request(cfg)  # bad input fails here, before any SSH
        command = build_preflight_command(request, cfg.cluster_name)
        for attempt in range(1, PREFLIGHT_ATTEMPTS + 1):
            result = hook.run(command, check=False, timeout=60)
            if result.returncode != 0:
                raise _fail(f"preflight could not run on {result.host} (exit {result.returncode}): {result.error_text}")
            report = parse_preflight(result.text, request)
            if not report.only_transient or attempt == PREFLIGHT_ATTEMPTS:
                break
            self.log.warning("slurmctld did not answer (%s); asking again", report.failures[0].problem)
            time.sleep(PREFLIGHT_RETRY_SECONDS * attempt)
        if not report.ok:
            lines = "\n".join(f"  - {f}" for f in report.failures)
            raise _fail(
                f"preflight on {result.host} found {len(report.failures)} problem(s); nothing was written or "
                f"submitted:\n{lines}"
            )
        self.log.info(
            "Preflight on %s passed: tools %s; Pyxis %s; Enroot %s; partitions %s; %d dataset path(s) present",
            result.host,
            ", ".join(sorted(report.tools)),
            report.pyxis,
            report.enroot,
            ", ".join(f"{n} (MaxTime {p.max_time_minutes} min)" for n, p in sorted(report.partitions.items())),
            len(request.dataset_paths),
        )
        return report.to_dict()


# --- Enroot credentials -----------------------------------------------------------------------------------


class SlurmEnrootCredentialsOperator(BaseOperator):
    """Install registry credentials for Enroot/Pyxis on the cluster, once per cluster and user.

    Reads the registry connection (host = registry, e.g. ``nvcr.io``; login, e.g. ``$oauthtoken``; password,
    e.g. the NGC API key) and writes netrc lines into ``~/.config/enroot/.credentials`` (for ``nvcr.io`` also
    ``authn.nvidia.com``) in a block of its own, mode 600, atomically. The secret goes over SSH stdin: never on
    a command line, in a log, in XCom or in a template field.
    """

    ui_color = "#f4ece8"

    def __init__(self, *, registry_conn_id: str, slurm_conn_id: str = "slurm_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not re.match(r"^[A-Za-z0-9_.-]{1,200}$", registry_conn_id or ""):
            raise NpaValidationError(f"registry_conn_id={registry_conn_id!r} is not a connection id")
        self.registry_conn_id = registry_conn_id
        self.slurm_conn_id = slurm_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk import BaseHook

        from npa_airflow.slurm.enroot import (
            CREDENTIALS_MARK,
            NGC_AUTH_HOST,
            NGC_REGISTRY,
            build_credentials_block,
            build_install_credentials_command,
        )
        from npa_airflow.slurm.hook import SlurmHook

        conn = BaseHook.get_connection(self.registry_conn_id)
        registry = (conn.host or "").strip()
        block = build_credentials_block(registry, conn.login or "", conn.password or "", key=self.registry_conn_id)
        hook = SlurmHook(self.slurm_conn_id)
        result = hook.run(build_install_credentials_command(self.registry_conn_id), stdin=block, check=False)
        del block
        line = next((ln for ln in result.text.splitlines() if ln.startswith(CREDENTIALS_MARK + " ")), "")
        if result.returncode != 0 or not line:
            raise _fail(
                f"could not install Enroot credentials for {registry} on {result.host} (exit {result.returncode}): "
                f"{result.error_text[-500:]}"
            )
        _, path, mode = line.split(" ", 2)
        hosts = [registry] + ([NGC_AUTH_HOST] if registry.split(":")[0] == NGC_REGISTRY else [])
        self.log.info("Installed Enroot credentials for %s in %s (mode %s) on %s", hosts, path, mode, result.host)
        return {"path": path, "mode": mode, "machines": hosts}


# --- .sqsh conversion ---------------------------------------------------------------------------------------


class SlurmSqshConvertOperator(SlurmJobOperatorBase):
    """Make sure ``image`` exists as a valid .sqsh on shared storage; return its path (XCom).

    A .sqsh reference is validated and returned. A registry reference maps to
    ``<sqsh_cache_dir>/<registry>+<image path>+<tag>.sqsh``: reused when valid (a ``:latest`` tag too, unless
    ``force_reconvert_latest``), else converted ONCE by a Slurm job on the CPU partition with the seed's
    profile (4 CPUs, 7200M, no exclusive node, >= 120 min, node-local Enroot temp paths), importing to a
    temporary name, validating and renaming into place. The job is waited on like any other (deferrable).
    A failed or truncated conversion fails the task; nothing ever falls back to a registry image. A conversion
    pending on a QOS memory limit (at any time while it waits) is cancelled and reported with the remedy.
    """

    template_fields: Sequence[str] = ("image", "target", "sqsh_cache_dir", "partition", "mem", "convert_script")
    template_fields_renderers = {"convert_script": "bash"}
    ui_color = "#efe8f4"

    def __init__(
        self,
        *,
        image: str,
        sqsh_cache_dir: str | None = None,
        target: str | None = None,
        partition: str | None = None,
        account: str | None = None,
        cpus: int = DEFAULT_CONVERT_CPUS,
        mem: str = DEFAULT_CONVERT_MEM,
        time_minutes: int = MIN_CONVERT_MINUTES,
        force_reconvert_latest: bool = False,
        results_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poll_interval", 10.0)
        super().__init__(**kwargs)
        self.image = image
        self.sqsh_cache_dir = sqsh_cache_dir
        self.target = target
        self.partition = partition
        self.account = account
        self.cpus = cpus
        self.mem = mem
        self.time_minutes = time_minutes
        self.force_reconvert_latest = force_reconvert_latest
        self.results_root = results_root
        self.convert_script = ""
        self._force = False

    def _ref(self) -> ImageRef:
        from npa_airflow.slurm.images import parse_image_ref

        return parse_image_ref(self.image, field="image")

    def target_path(self, cfg: SlurmConnectionConfig) -> str:
        from npa_airflow.slurm.images import sqsh_path_for

        ref = self._ref()
        if ref.is_sqsh:
            return ref.sqsh_path or ""
        if self.target:
            if not self.target.startswith("/") or not self.target.endswith(".sqsh"):
                raise NpaValidationError(f"target={self.target!r} must be an absolute path ending in .sqsh")
            return self.target
        cache_dir = self.sqsh_cache_dir or cfg.sqsh_cache_dir
        if not cache_dir:
            raise NpaValidationError(
                f"no .sqsh cache directory: pass sqsh_cache_dir= or set sqsh_cache_dir on connection "
                f"{self.slurm_conn_id!r} (an absolute directory on shared storage)"
            )
        return sqsh_path_for(ref, cache_dir)

    def execute(self, context: Context) -> Any:
        hook = self.get_hook()
        ref = self._ref()
        target = self.target_path(hook.config)
        if ref.is_sqsh:
            if not target.startswith("/"):
                self.log.info("Using the relative image %s as given (it is resolved in the job's directory)", target)
                return target
            check = check_sqsh(hook, target)
            if not check.valid:
                raise _fail(
                    f"image {check.describe()}. Re-create it (e.g. give the registry reference to this operator) "
                    "before any GPU job uses it."
                )
            self.log.info("Using the existing image %s (%d bytes, valid)", target, check.size or 0)
            return target

        from npa_airflow.slurm.images import SqshStatus

        check = check_sqsh(hook, target)
        if check.status is SqshStatus.NO_TOOL:
            raise _fail(f"{check.describe()}; cannot tell a complete image from a truncated one")
        if check.valid and not (ref.is_latest and self.force_reconvert_latest):
            self.log.info(
                "Reusing %s for %s: already converted and valid (%d bytes); no conversion job submitted",
                target,
                ref.pyxis_ref,
                check.size or 0,
            )
            return target
        if check.valid:
            self.log.info("%s is valid, but %s is ':latest' and force_reconvert_latest is set", target, ref.pyxis_ref)
            self._force = True
        elif check.status is not SqshStatus.MISSING:
            self.log.warning("Existing %s; it will be replaced by a fresh conversion", check.describe())
        self.log.info("Converting %s to %s on a CPU partition", ref.enroot_uri, target)
        return super().execute(context)

    def prepare_job(self, context: Context, job_name: str, exclude_nodes: Sequence[str]) -> PreparedJob:
        from npa_airflow.slurm.enroot import ConvertSpec, render_convert_script

        cfg = self.get_hook().config
        root = _results_root(cfg, self.results_root, self.slurm_conn_id)
        partition = self.partition or cfg.cpu_partition
        if not partition:
            raise NpaValidationError(
                f"no CPU partition for the conversion: pass partition= or set cpu_partition on connection "
                f"{self.slurm_conn_id!r} (never a GPU partition: the conversion must cost no GPU time)"
            )
        target = self.target_path(cfg)
        log_dir = f"{root}/slurm-logs"
        spec = ConvertSpec(
            image=self.image,
            target=target,
            job_name=job_name,
            partition=partition,
            account=self.account or cfg.account,
            stdout_path=f"{log_dir}/%x-%j.out",
            stderr_path=f"{log_dir}/%x-%j.err",
            cpus=self.cpus,
            mem=self.mem,
            time_minutes=self.time_minutes,
            force=self._force,
        )
        target_dir = target.rsplit("/", 1)[0] or "/"
        return PreparedJob(
            job_name=job_name,
            script=render_convert_script(spec),
            script_path=f"{root}/sbatch/{job_name}.sbatch",
            results_dir=target_dir,
            stdout_path=spec.stdout_path,
            stderr_path=spec.stderr_path,
            mkdirs=(log_dir, target_dir),
            wall_seconds=spec.time_minutes * 60,
            partition=partition,
            time_minutes=spec.time_minutes,
        )

    def _show_submitted(self, job: PreparedJob) -> None:
        self.convert_script = job.script

    def _trigger(self, handle: SlurmJobHandle, deadline: float | None, log_offsets: dict | None = None) -> Any:
        """The shared trigger, plus: a job held by a QOS memory limit ends the wait (see convert_trigger)."""
        from npa_airflow.slurm.convert_trigger import SqshConvertTrigger

        _, kwargs = super()._trigger(handle, deadline, log_offsets).serialize()
        return SqshConvertTrigger(**kwargs)

    def fail_blocked_by_qos(self, event: dict[str, Any]) -> None:
        """The seed's rule for a conversion held by QOSGrpMemLimit: cancel it and say what to do, never wait."""
        from npa_airflow.slurm.enroot import qos_memory_advice
        from npa_airflow.slurm.handle import SlurmJobHandle

        handle = SlurmJobHandle.from_dict(event["handle"])
        hook = self.get_hook()
        partition = self.partition or hook.config.cpu_partition or "?"
        reason = str(event.get("reason") or "QOSGrpMemLimit")
        self._cancel(hook, handle, f"pending on {reason}")
        self._done = True
        advice = qos_memory_advice(handle.job_id, reason, partition, self.cpus, str(self.mem))
        raise _fail(advice or f"conversion job {handle.job_id} is pending on {reason}; it was cancelled")

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        from airflow.sdk.exceptions import AirflowException

        if isinstance(event, dict) and event.get("blocked_by_qos") and isinstance(event.get("handle"), dict):
            self.fail_blocked_by_qos(event)
        try:
            super().execute_complete(context, event)
        except AirflowException as exc:
            raise type(exc)(
                f"conversion of {self.image} failed; no .sqsh was published and no GPU job may fall back to the "
                f"registry image. Fix it on the CPU partition and retry. {exc}"
            ) from exc
        hook = self.get_hook()
        target = self.target_path(hook.config)
        check = check_sqsh(hook, target)
        if not check.valid:
            raise _fail(f"the conversion job ended COMPLETED but {check.describe()}")
        self.log.info("Converted %s to %s (%d bytes, valid)", self.image, target, check.size or 0)
        return target


# --- NCCL probe ---------------------------------------------------------------------------------------------

_KNOB_SUFFIX_RE = re.compile(r"-k([0-9]+)(-t[0-9]+)$")


class SlurmNcclProbeOperator(SlurmJobOperatorBase):
    """Prove the collective transport works before the real multi-node job; return the env that works (XCom).

    Gate: runs when the real job uses 2+ nodes or 2+ GPUs on one node; otherwise returns ``{}`` at once.
    A cached working environment for (connection, partition) in the Airflow Variable
    ``npa_nccl_env::<conn_id>::<partition>`` skips the probe (``force_probe`` ignores it). Otherwise a
    2-node job (one task per node, torchrun, ~120 s bound) all-reduces with NCCL on GPUs or gloo on CPUs; a
    hang or timeout moves on to the next knob set (default: none, then ``NCCL_P2P_DISABLE=1``, then also
    ``NCCL_IB_DISABLE=1`` and ``NCCL_SOCKET_IFNAME``); the first set that works is cached and returned. Any
    other failure (e.g. torch missing in the image) fails the task at once.

    :param nodes: / :param gpus_per_node: the real job's shape (the probe uses at most 2 nodes).
    :param image: the .sqsh to probe in (the convert task's XCom); ``None`` runs on the node's host.
    :param extra_env: environment for the probe only (not cached, not returned).
    """

    template_fields: Sequence[str] = ("image", "partition", "extra_env", "probe_script")
    template_fields_renderers = {"probe_script": "bash", "extra_env": "json"}
    ui_color = "#e8eef4"

    def __init__(
        self,
        *,
        nodes: int = 2,
        gpus_per_node: int = 0,
        procs_per_node: int | None = None,
        partition: str | None = None,
        account: str | None = None,
        image: str | None = None,
        container_mounts: Sequence[str] = (),
        knob_sets: Sequence[Mapping[str, Any]] | None = None,
        socket_ifname: str = DEFAULT_SOCKET_IFNAME,
        timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
        extra_env: Mapping[str, str] | None = None,
        use_cache: bool = True,
        force_probe: bool = False,
        results_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        from npa_airflow.slurm.probe import default_knob_sets, validate_knob_sets

        kwargs.setdefault("poll_interval", 5.0)
        kwargs.setdefault("on_previous_try", "cancel")
        super().__init__(**kwargs)
        for name, value, low in (("nodes", nodes, 1), ("gpus_per_node", gpus_per_node, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise NpaValidationError(f"{name}={value!r} must be an integer >= {low}")
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.procs_per_node = procs_per_node if procs_per_node is not None else max(1, gpus_per_node)
        self.partition = partition
        self.account = account
        self.image = image
        self.container_mounts = list(container_mounts)
        self.knob_sets = validate_knob_sets(knob_sets if knob_sets is not None else default_knob_sets(socket_ifname))
        self.timeout_seconds = timeout_seconds
        self.extra_env = dict(extra_env or {})
        self.use_cache = use_cache
        self.force_probe = force_probe
        self.results_root = results_root
        self.probe_script = ""
        self._knob_index = 0

    # -- cache ---------------------------------------------------------------------------------------------

    def _partition(self, cfg: SlurmConnectionConfig) -> str:
        partition = self.partition or cfg.partition
        if not partition:
            raise NpaValidationError(
                f"no partition for the probe: pass partition= or set partition on connection {self.slurm_conn_id!r}"
            )
        return partition

    def cache_key(self) -> str:
        from npa_airflow.slurm.probe import cache_key

        return cache_key(self.slurm_conn_id, self._partition(self.get_hook().config))

    def cached_env(self) -> dict[str, str] | None:
        from airflow.sdk import Variable

        from npa_airflow.slurm.probe import decode_cache

        try:
            return decode_cache(Variable.get(self.cache_key(), default=None))
        except Exception as exc:
            self.log.warning("Could not read the cached probe result: %s", exc)
            return None

    # -- execute ---------------------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        from npa_airflow.slurm.probe import knobs_label, probe_needed

        if not probe_needed(self.nodes, self.gpus_per_node):
            self.log.info("No probe needed: %d node(s) x %d GPU(s)", self.nodes, self.gpus_per_node)
            return {}
        if self.image is not None:
            from npa_airflow.slurm.images import require_sqsh_image

            require_sqsh_image(self.image)
        if self.use_cache and not self.force_probe:
            cached = self.cached_env()
            if cached is not None:
                self.log.info(
                    "Using the cached working environment %s (Variable %s); probe skipped",
                    knobs_label(cached),
                    self.cache_key(),
                )
                return cached
        return self._probe(context, 0)

    def _probe(self, context: Context, index: int) -> Any:
        from npa_airflow.slurm.probe import knobs_label

        self._knob_index = index
        self.log.info(
            "Probing with knob set %d/%d: %s", index + 1, len(self.knob_sets), knobs_label(self.knob_sets[index])
        )
        return super().execute(context)

    def job_name_for_context(self, context: Context) -> str:
        base = super().job_name_for_context(context)
        head, _, try_part = base.rpartition("-t")
        return f"{head}-k{self._knob_index}-t{try_part}"

    def prepare_job(self, context: Context, job_name: str, exclude_nodes: Sequence[str]) -> PreparedJob:
        from npa_airflow.slurm.probe import ProbeSpec, probe_source, render_probe_script, validate_env
        from npa_airflow.slurm.staging import StagedFile

        cfg = self.get_hook().config
        root = _results_root(cfg, self.results_root, self.slurm_conn_id)
        results_dir = f"{root}/{job_name}"
        script_path = f"{results_dir}/nccl_allreduce_probe.py"
        mounts = tuple(dict.fromkeys([f"{results_dir}:{results_dir}", *self.container_mounts]))
        env = {**validate_env(self.extra_env, "extra_env"), **self.knob_sets[self._knob_index]}
        spec = ProbeSpec(
            job_name=job_name,
            partition=self._partition(cfg),
            account=self.account or cfg.account,
            script_path=script_path,
            stdout_path=f"{results_dir}/probe-%j.out",
            stderr_path=f"{results_dir}/probe-%j.out",
            nodes=min(self.nodes, 2),
            gpus_per_node=self.gpus_per_node,
            procs_per_node=self.procs_per_node,
            image=self.image,
            mounts=mounts if self.image else (),
            env=env,
            timeout_seconds=self.timeout_seconds,
        )
        return PreparedJob(
            job_name=job_name,
            script=render_probe_script(spec),
            script_path=f"{results_dir}/probe.sbatch",
            results_dir=results_dir,
            stdout_path=spec.stdout_path,
            stderr_path=spec.stderr_path,
            mkdirs=(results_dir,),
            files=(StagedFile(script_path, probe_source(), 0o644),),
            wall_seconds=spec.time_minutes * 60,
            partition=spec.partition,
            time_minutes=spec.time_minutes,
        )

    def _show_submitted(self, job: PreparedJob) -> None:
        self.probe_script = job.script

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        from airflow.sdk import Variable

        from npa_airflow.slurm.handle import SlurmJobHandle
        from npa_airflow.slurm.probe import classify_probe_event, encode_cache, knobs_label
        from npa_airflow.slurm.triggers import validate_event

        event = validate_event(event)
        handle = SlurmJobHandle.from_dict(event["handle"])
        m = _KNOB_SUFFIX_RE.search(handle.job_name)
        index = int(m.group(1)) if m else 0
        if index >= len(self.knob_sets):
            raise _fail(f"probe job {handle.job_name} names knob set {index}, but only {len(self.knob_sets)} exist")
        knobs = self.knob_sets[index]
        self._knob_index = index  # this instance now names the same job as the event (the base compares names)
        outcome = classify_probe_event(event)
        if outcome == "ok":
            self._done = True
            if self.use_cache:
                Variable.set(
                    self.cache_key(),
                    encode_cache(
                        knobs,
                        job_id=handle.job_id,
                        knob_index=index,
                        probed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    ),
                )
            self.log.info(
                "Probe passed with knob set %d (%s) in job %s; cached as %s",
                index + 1,
                knobs_label(knobs),
                handle.job_id,
                self.cache_key() if self.use_cache else "(cache off)",
            )
            return dict(knobs)
        if outcome == "error":
            return super().execute_complete(context, event)
        if event["status"] == "deadline":
            self._cancel(self.get_hook(), handle, "the probe's deadline passed")
        self.log.warning(
            "Probe with knob set %d (%s) hung or timed out (job %s, %s)",
            index + 1,
            knobs_label(knobs),
            handle.job_id,
            event.get("native_state"),
        )
        if index + 1 < len(self.knob_sets):
            return self._probe(context, index + 1)
        self._done = True
        tried = "; ".join(f"{i + 1}: {knobs_label(k)}" for i, k in enumerate(self.knob_sets))
        raise _fail(
            f"the collective probe hung with every knob set ({tried}). Do not start the multi-node job: check the "
            "fabric (NCCL_SOCKET_IFNAME, NCCL_IB_HCA) with the site and add a knob set that works."
        )
