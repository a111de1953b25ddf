"""`SlurmNcclProbeOperator`: prove the collective transport works before the real multi-node job.

A 2-node all-reduce under the container's torchrun; on a hang, the next knob set (one step, and one Slurm job
named ``...-k<index>-t<try>``, per knob set; the index travels in the deferral kwargs). The working environment
is cached per cluster and partition and returned for the submit task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import Variable

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators.base import SlurmJobOperatorBase
from npa_airflow.slurm.operators.job import JobEnvironment, PreparedJob, fail_task, results_root_for
from npa_airflow.slurm.submit import layout

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

# Defaults, kept literal so a DAG file does not import the builders (equal to probe.DEFAULT_*; a unit test
# holds them together).
DEFAULT_SOCKET_IFNAME = "eth0"
DEFAULT_TIMEOUT_SECONDS = 120


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
        # DAG parse: the probe builders (enroot, templates) load only when an operator is made
        from npa_airflow.slurm.submit.probe import default_knob_sets, validate_knob_sets

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

    # -- cache ---------------------------------------------------------------------------------------------

    def _partition(self, cfg: SlurmConnectionConfig) -> str:
        partition = self.partition or cfg.partition
        if not partition:
            raise NpaValidationError(
                f"no partition for the probe: pass partition= or set partition on connection {self.slurm_conn_id!r}"
            )
        return partition

    def cache_key(self, context: Context) -> str:
        """The Variable of the working environment for this connection and partition (this try's config)."""
        # DAG parse: the probe builders are run-time only
        from npa_airflow.slurm.submit.probe import cache_key

        return cache_key(self.slurm_conn_id, self._partition(self.this_try(context).hook.config))

    def cached_env(self, context: Context) -> dict[str, str] | None:
        # DAG parse: the probe builders are run-time only
        from npa_airflow.slurm.submit.probe import decode_cache

        try:
            return decode_cache(Variable.get(self.cache_key(context), default=None))
        except Exception as exc:
            self.log.warning("Could not read the cached probe result: %s", exc)
            return None

    # -- steps: one probe job per knob set -----------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        # DAG parse: the probe builders are run-time only
        from npa_airflow.slurm.submit.probe import knobs_label, probe_needed

        if not probe_needed(self.nodes, self.gpus_per_node):
            self.log.info("No probe needed: %d node(s) x %d GPU(s)", self.nodes, self.gpus_per_node)
            return {}
        if self.image is not None:
            # DAG parse: the image helpers are run-time only
            from npa_airflow.slurm.submit.images import require_sqsh_image

            require_sqsh_image(self.image)
        if self.use_cache and not self.force_probe:
            cached = self.cached_env(context)
            if cached is not None:
                self.log.info(
                    "Using the cached working environment %s (Variable %s); probe skipped",
                    knobs_label(cached),
                    self.cache_key(context),
                )
                return cached
        return self.probe_knob_set(context, 0)

    def probe_knob_set(self, context: Context, knob_index: int) -> Any:
        """Submit the probe with knob set `knob_index`; its event goes to `probe_complete` with the index."""
        # DAG parse: the probe builders are run-time only
        from npa_airflow.slurm.submit.probe import knobs_label

        self.log.info(
            "Probing with knob set %d/%d: %s",
            knob_index + 1,
            len(self.knob_sets),
            knobs_label(self.knob_sets[knob_index]),
        )
        return self.submit_and_wait(
            context,
            self.job_name_for_knob_set(context, knob_index),
            step={"knob_index": knob_index},
            next_method="probe_complete",
            next_kwargs={"knob_index": knob_index},
        )

    def job_name_for_knob_set(self, context: Context, knob_index: int) -> str:
        """This try's job name with ``-k<index>``: each knob set's job has a name of its own (adoption by name)."""
        base = self.job_name_for_context(context)
        head, _, try_part = base.rpartition("-t")
        return f"{head}-k{knob_index}-t{try_part}"

    def prepare_job(
        self, job_name: str, exclude_nodes: Sequence[str], env: JobEnvironment, step: Mapping[str, Any]
    ) -> PreparedJob:
        """The probe job with knob set `step["knob_index"]`."""
        # DAG parse: the probe, container and staging builders are run-time only
        from npa_airflow.slurm.submit.container import merge_mounts
        from npa_airflow.slurm.submit.probe import ProbeSpec, probe_source, render_probe_script, validate_env
        from npa_airflow.slurm.submit.staging import StagedFile

        cfg = env.config
        root = results_root_for(cfg, self.results_root, self.slurm_conn_id)
        results_dir = layout.results_dir(root, job_name)
        script_path = f"{results_dir}/nccl_allreduce_probe.py"
        mounts = merge_mounts((results_dir,), self.container_mounts)  # the probe script lives in results_dir
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
            workdir=results_dir if self.image else None,
            env={**validate_env(self.extra_env, "extra_env"), **self.knob_sets[int(step["knob_index"])]},
            timeout_seconds=self.timeout_seconds,
        )
        return PreparedJob.from_spec(
            spec,
            render_probe_script(spec),
            script_path=layout.probe_script_path(root, job_name),
            results_dir=results_dir,
            mkdirs=(results_dir,),
            files=(StagedFile(script_path, probe_source(), 0o644),),
        )

    def _show_submitted(self, job: PreparedJob) -> None:
        self.probe_script = job.script

    def probe_complete(
        self, context: Context, event: dict[str, Any] | None = None, knob_index: int | None = None
    ) -> Any:
        """The probe with knob set `knob_index` ended: return its env, try the next set on a hang, or fail."""
        # DAG parse: the probe builders and the trigger module are run-time only
        from npa_airflow.slurm.submit.probe import classify_probe_event, knobs_label
        from npa_airflow.slurm.triggers import event_handle, validate_event

        event = validate_event(event)
        handle = event_handle(event)
        if knob_index is None:
            knob_index = self._knob_index_of(context, handle.job_name)
        if knob_index >= len(self.knob_sets):
            raise fail_task(
                f"probe job {handle.job_name} ran knob set {knob_index}, but only {len(self.knob_sets)} exist"
            )
        outcome = classify_probe_event(event)
        if outcome == "ok":
            return self._probe_passed(context, handle, knob_index)
        if outcome == "error":
            return self.complete_job(context, event, own_job_name=self.job_name_for_knob_set(context, knob_index))
        this = self.this_try(context)
        if event["status"] == "deadline":
            self.cancelling(this).cancel_job(this.hook_for(handle), handle, "the probe's deadline passed")
        self.log.warning(
            "Probe with knob set %d (%s) hung or timed out (job %s, %s)",
            knob_index + 1,
            knobs_label(self.knob_sets[knob_index]),
            handle.job_id,
            event.get("native_state"),
        )
        if knob_index + 1 < len(self.knob_sets):
            return self.probe_knob_set(context, knob_index + 1)
        this.done = True
        tried = "; ".join(f"{i + 1}: {knobs_label(k)}" for i, k in enumerate(self.knob_sets))
        raise fail_task(
            f"the collective probe hung with every knob set ({tried}). Do not start the multi-node job: check the "
            "fabric (NCCL_SOCKET_IFNAME, NCCL_IB_HCA) with the site and add a knob set that works."
        )

    def _knob_index_of(self, context: Context, job_name: str) -> int:
        """Which of this try's knob-set jobs ended, when the deferral kwargs did not come back.

        Airflow 3.3.2's ``dag.test()`` resumes a deferred task with ``{"event": ...}`` only, dropping the kwargs
        given to ``defer`` (the scheduler path keeps them): the job is then one of the names this try submits.
        """
        for index in range(len(self.knob_sets)):
            if self.job_name_for_knob_set(context, index) == job_name:
                return index
        raise fail_task(f"probe job {job_name} is none of this try's knob-set jobs; its knob set is unknown")

    def _probe_passed(self, context: Context, handle: SlurmJobHandle, knob_index: int) -> dict[str, str]:
        """Cache the working knob set (unless the cache is off) and return it."""
        # DAG parse: the probe builders are run-time only
        from npa_airflow.slurm.submit.probe import encode_cache, knobs_label

        self.this_try(context).done = True
        knobs = self.knob_sets[knob_index]
        key = self.cache_key(context) if self.use_cache else "(cache off)"
        if self.use_cache:
            Variable.set(
                key,
                encode_cache(
                    knobs,
                    job_id=handle.job_id,
                    knob_index=knob_index,
                    probed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                ),
            )
        self.log.info(
            "Probe passed with knob set %d (%s) in job %s; cached as %s",
            knob_index + 1,
            knobs_label(knobs),
            handle.job_id,
            key,
        )
        return dict(knobs)
