"""`SlurmSqshConvertOperator`: a container image as a valid .sqsh on shared storage, converted at most once.

A valid cached .sqsh is reused; otherwise the image is converted ONCE as a CPU Slurm job (waited on like any
other, deferrable) and the .sqsh path is returned. A failed conversion fails the task: there is no fallback to a
registry image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators.base import SlurmJobOperatorBase
from npa_airflow.slurm.operators.job import JobEnvironment, PreparedJob, fail_task, results_root_for
from npa_airflow.slurm.submit import layout

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.submit.images import ImageRef, SqshCheck
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

# Defaults, kept literal so a DAG file does not import the builders (equal to enroot.DEFAULT_CONVERT_*; a unit
# test holds them together). The conversion profile is the seed's.
DEFAULT_CONVERT_CPUS = 4
DEFAULT_CONVERT_MEM = "7200M"
MIN_CONVERT_MINUTES = 120


def check_sqsh(hook: SlurmHook, path: str) -> SqshCheck:
    """Validate a .sqsh on shared storage from the login host (hsqs magic, unsquashfs -s, full size)."""
    # DAG parse: the image helpers are run-time only
    from npa_airflow.slurm.submit.images import build_sqsh_validate_command, parse_sqsh_validation

    result = hook.run(build_sqsh_validate_command(path), check=True)
    return parse_sqsh_validation(result.text, path)


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

    def _ref(self) -> ImageRef:
        # DAG parse: the image helpers are run-time only
        from npa_airflow.slurm.submit.images import parse_image_ref

        return parse_image_ref(self.image, field="image")

    def target_path(self, cfg: SlurmConnectionConfig) -> str:
        # DAG parse: the image helpers are run-time only
        from npa_airflow.slurm.submit.images import sqsh_path_for

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
        hook = self.this_try(context).hook
        ref = self._ref()
        target = self.target_path(hook.config)
        if ref.is_sqsh:
            return self._existing_image(hook, target)

        # DAG parse: the image helpers are run-time only
        from npa_airflow.slurm.submit.images import SqshStatus

        check = check_sqsh(hook, target)
        if check.status is SqshStatus.NO_TOOL:
            raise fail_task(f"{check.describe()}; cannot tell a complete image from a truncated one")
        force = False
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
            force = True
        elif check.status is not SqshStatus.MISSING:
            self.log.warning("Existing %s; it will be replaced by a fresh conversion", check.describe())
        self.log.info("Converting %s to %s on a CPU partition", ref.enroot_uri, target)
        return self.submit_and_wait(context, self.job_name_for_context(context), step={"force": force})

    def _existing_image(self, hook: SlurmHook, target: str) -> str:
        """`image` names a .sqsh already: check it (an absolute one) and return it; nothing is submitted."""
        if not target.startswith("/"):
            self.log.info("Using the relative image %s as given (it is resolved in the job's directory)", target)
            return target
        check = check_sqsh(hook, target)
        if not check.valid:
            raise fail_task(
                f"image {check.describe()}. Re-create it (e.g. give the registry reference to this operator) "
                "before any GPU job uses it."
            )
        self.log.info("Using the existing image %s (%d bytes, valid)", target, check.size or 0)
        return target

    def prepare_job(
        self, job_name: str, exclude_nodes: Sequence[str], env: JobEnvironment, step: Mapping[str, Any]
    ) -> PreparedJob:
        """The conversion job; `step["force"]` replaces a valid image (a ':latest' tag asked to reconvert)."""
        # DAG parse: the enroot builders are run-time only
        from npa_airflow.slurm.submit.enroot import ConvertSpec, render_convert_script

        cfg = env.config
        root = results_root_for(cfg, self.results_root, self.slurm_conn_id)
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
            force=bool(step.get("force", False)),
        )
        target_dir = target.rsplit("/", 1)[0] or "/"
        return PreparedJob.from_spec(
            spec,
            render_convert_script(spec),
            script_path=layout.script_path(root, job_name),
            results_dir=target_dir,
            mkdirs=(log_dir, target_dir),
        )

    def _show_submitted(self, job: PreparedJob) -> None:
        self.convert_script = job.script

    def _trigger(self, handle: SlurmJobHandle, deadline: float | None) -> Any:
        """The shared trigger, plus: a job held by a QOS memory limit ends the wait (see convert_trigger)."""
        # DAG parse: the trigger loads the poller and the hook (asyncssh)
        from npa_airflow.slurm.convert_trigger import SqshConvertTrigger

        return SqshConvertTrigger(**self._trigger_kwargs(handle, deadline))

    def cancel_held_by_qos_memory(self, context: Context, event: dict[str, Any]) -> None:
        """The seed's rule for a conversion held by QOSGrpMemLimit: cancel it and say what to do, never wait."""
        # DAG parse: the enroot builders and the trigger module are run-time only
        from npa_airflow.slurm.submit.enroot import qos_memory_advice
        from npa_airflow.slurm.triggers import event_handle

        handle = event_handle(event)
        this = self.this_try(context)
        hook = this.hook_for(handle)
        partition = self.partition or hook.config.cpu_partition or "?"
        reason = str(event.get("reason") or "QOSGrpMemLimit")
        report = self.cancelling(this).cancel_job(hook, handle, f"pending on {reason}")
        this.done = True
        advice = qos_memory_advice(handle.job_id, reason, partition, self.cpus, str(self.mem))
        raise fail_task(f"{advice or f'conversion job {handle.job_id} is pending on {reason}'} ({report.says})")

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """The conversion job ended: the image must now be a valid .sqsh at the target."""
        # A conversion held by a QOS memory limit (status held_by_qos; before it had its own status, a deadline
        # event flagged blocked_by_qos, which a task deferred across an upgrade may still receive).
        held = isinstance(event, dict) and (event.get("status") == "held_by_qos" or event.get("blocked_by_qos"))
        if held and isinstance(event.get("handle"), dict):
            self.cancel_held_by_qos_memory(context, event)
        try:
            super().execute_complete(context, event)
        except AirflowException as exc:
            raise type(exc)(
                f"conversion of {self.image} failed; no .sqsh was published and no GPU job may fall back to the "
                f"registry image. Fix it on the CPU partition and retry. {exc}"
            ) from exc
        hook = self.this_try(context).hook
        target = self.target_path(hook.config)
        check = check_sqsh(hook, target)
        if not check.valid:
            raise fail_task(f"the conversion job ended COMPLETED but {check.describe()}")
        self.log.info("Converted %s to %s (%d bytes, valid)", self.image, target, check.size or 0)
        return target
