"""`SlurmPreflightOperator`: check the cluster before anything is staged or submitted.

One read-only SSH round trip checks tools, Pyxis/Enroot, storage, datasets and partitions; each failure names
what is missing and what to do. Nothing is written or submitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from npa_airflow.common.retry import Backoff, Budget, pause
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators.job import fail_task, results_root_for

if TYPE_CHECKING:
    from airflow.sdk import Context

    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig

PREFLIGHT_ATTEMPTS = 3  # only a controller that does not answer is asked again
PREFLIGHT_RETRY_SECONDS = 5.0
PREFLIGHT_BACKOFF = Backoff(base=PREFLIGHT_RETRY_SECONDS, cap=2 * PREFLIGHT_RETRY_SECONDS, jitter=0.2)


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
        # DAG parse: the preflight builders load the Slurm command builders
        from npa_airflow.slurm.submit.preflight import SLURM_TOOLS, PreflightRequest

        writable = [("results_root", results_root_for(cfg, self.results_root, self.slurm_conn_id))]
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
        # DAG parse: the hook loads asyncssh
        from npa_airflow.slurm.hook import SlurmHook

        hook = SlurmHook(self.slurm_conn_id)
        cfg = hook.config
        request = self.build_request(cfg)  # bad input fails here, before any SSH
        host, report = self._run_checks(hook, request, cfg.cluster_name)
        if not report.ok:
            lines = "\n".join(f"  - {f}" for f in report.failures)
            raise fail_task(
                f"preflight on {host} found {len(report.failures)} problem(s); nothing was written or "
                f"submitted:\n{lines}"
            )
        self.log.info(
            "Preflight on %s passed: tools %s; Pyxis %s; Enroot %s; partitions %s; %d dataset path(s) present; %s",
            host,
            ", ".join(sorted(report.tools)),
            report.pyxis,
            report.enroot,
            ", ".join(f"{n} (MaxTime {p.max_time_minutes} min)" for n, p in sorted(report.partitions.items())),
            len(request.dataset_paths),
            report.accounting_mode,
        )
        return report.to_dict()

    def _run_checks(self, hook: Any, request: Any, cluster_name: str | None) -> tuple[str, Any]:
        """Run the checks; ask again (up to PREFLIGHT_ATTEMPTS) only while the controller alone did not answer."""
        # DAG parse: the preflight builders load the Slurm command builders
        from npa_airflow.slurm.submit.preflight import build_preflight_command, parse_preflight

        command = build_preflight_command(request, cluster_name)
        budget = Budget(attempts=PREFLIGHT_ATTEMPTS)
        while True:
            result = hook.run(command, check=False, timeout=60)
            if result.returncode != 0:
                raise fail_task(
                    f"preflight could not run on {result.host} (exit {result.returncode}): {result.error_text}"
                )
            report = parse_preflight(result.text, request)
            delay = PREFLIGHT_BACKOFF.delay(budget.failures + 1)
            if not report.only_transient or not budget.allows(delay):
                return result.host, report
            self.log.warning("slurmctld did not answer (%s); asking again", report.failures[0].problem)
            pause(delay)
