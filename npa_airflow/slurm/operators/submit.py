"""`SlurmSubmitOperator`: one sbatch job rendered from the seed's templates (an `SbatchSpec`), waited on."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk.configuration import conf

from npa_airflow.common.secret_env import resolve_secret_env, validate_secret_env
from npa_airflow.slurm.operators.base import SlurmJobOperatorBase
from npa_airflow.slurm.operators.job import JobEnvironment, PreparedJob, results_root_for
from npa_airflow.slurm.operators.trigger_start import StartsInTriggerer
from npa_airflow.slurm.submit import layout

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import Context

    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.submit.spec import SbatchSpec
    from npa_airflow.slurm.transport.connection import SlurmConnectionConfig


class SlurmSubmitOperator(StartsInTriggerer, SlurmJobOperatorBase):
    """Submit one sbatch job rendered from the seed's templates and wait for it (deferrable).

    Resources and commands mirror `SbatchSpec` (see its docstring for defaults and limits). `results_root`
    and `partition`/`account` default to the connection's. Each try gets its own results directory
    `<results_root>/<job name>`; `{results_dir}`, `{job_id}` (the job name: this try's record id) and
    `{config_path}` are bound in commands and environment.

    :param inputs: datasets/files the job reads (`lustre:///abs/path` or absolute shared paths); each is
        checked with `test -e` on the cluster before anything is written, and in a container it is mounted at
        the same path (as are the results dir and `config_path`).
    :param container_mounts: extra Pyxis mounts (`/src[:/dst[:flags]]`) on top of the job's own paths; one with
        the same target as a job path replaces that mount.
    :param container_workdir: where the step starts in the container (`--container-workdir`); default: the
        results dir, so a relative path in `command` resolves there.
    :param secret_env: {ENV_NAME: "var:VARIABLE" | "conn:CONN_ID[:field]"}: session credentials written to
        a mode-600 sidecar the job sources and shreds; never in the script, logs, XCom or template fields.
    :param exclude_nodes: nodes never to use (bad nodes from infrastructure failures are added per try).
    :param checkpoint_signal: `'<SIGNAL>@<seconds>'` (USR1, USR2, TERM, INT or HUP), e.g. `'USR1@300'`: Slurm
        warns the command that many seconds before the time limit (up to 60 s earlier), so it can write a
        checkpoint and exit. Each task passes the signal (and SIGTERM) on to every process of the command, which
        sees `NPA_CHECKPOINT_SIGNAL` and `NPA_CHECKPOINT_SECONDS`. It must come before the child timeout
        (`timeout_hours`). Checked at DAG parse time; not templated.
    :param max_segments: continue a run longer than the time limit over up to this many Slurm jobs (default 1: no
        continuation). Each job sees `NPA_CONTINUE_FILE`, `NPA_SEGMENT` and `NPA_MAX_SEGMENTS`; a command that
        checkpoints (warned by `checkpoint_signal`) writes one line to `NPA_CONTINUE_FILE` ("step 41000") and exits,
        and the next job (`<name>-s<k>-t<try>`, same results dir, same try, still deferred) resumes from the
        checkpoint. A job that ends without the file ends the run (its outcome is the task's). Not templated.
    :param max_preemptions: a job preempted without requeue (PREEMPTED) is resubmitted as the next segment up to this
        many times in one try (default 3) without spending a retry; then it is an infrastructure failure.
    :param success_marker: the template writes `status.json` into the results dir only when every task
        succeeded; a COMPLETED job without it fails the task. `None` trusts the Slurm state alone.
    :param start_from_trigger: start in the triggerer, no worker (`operators/trigger_start.py`): it renders,
        checks, submits and waits there and ends the task there when the job succeeds; a failure, a later try or
        a segment resumes on a worker. Needs `deferrable`. Not templated.

    The rendered script is the template field `sbatch_script` ("Rendered Template" in the UI).
    `command` and the other text fields are Jinja templates: bash's `${#VAR}` opens a Jinja comment, so
    write `{{ '${#VAR}' }}` (or avoid it); a literal `{name}` is `{% raw %}{{name}}{% endraw %}`. Values keep
    their final newline (Airflow's Jinja would drop it; see `SlurmJobOperatorBase.render_template`).
    """

    template_fields: Sequence[str] = (
        "command",
        "environment",
        "partition",
        "account",
        "image",
        "container_mounts",
        "container_workdir",
        "extra_sbatch",
        "pre_commands",
        "post_commands",
        "leader_post_commands",
        "inputs",
        "results_root",
        "log_dir",
        "config_path",
        "sbatch_script",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "sbatch_script": "bash",
        "command": "bash",
        "environment": "json",
    }

    def __init__(
        self,
        *,
        command: str,
        nodes: int = 1,
        gpus_per_node: int = 4,
        cpus_per_task: int = 16,
        time_hours: float = 4.0,
        timeout_hours: float | None = None,
        max_gpus_per_node: int = 8,
        partition: str | None = None,
        account: str | None = None,
        image: str | None = None,
        container_mounts: Sequence[str] = (),
        container_workdir: str | None = None,
        environment: Mapping[str, str] | None = None,
        extra_sbatch: Sequence[str] = (),
        requeue: bool = True,
        pre_commands: Sequence[str] = (),
        post_commands: Sequence[str] = (),
        leader_post_commands: Sequence[str] = (),
        inputs: Sequence[str] = (),
        results_root: str | None = None,
        log_dir: str | None = None,
        config_path: str | None = None,
        secret_env: Mapping[str, str] | None = None,
        exclude_nodes: Sequence[str] = (),
        success_marker: str | None = "status.json",
        checkpoint_signal: str | None = None,
        max_segments: int = 1,
        max_preemptions: int = 3,
        start_from_trigger: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(success_marker=success_marker, **kwargs)
        self.use_start_from_trigger(start_from_trigger)
        self.nodes, self.gpus_per_node, self.max_gpus_per_node = nodes, gpus_per_node, max_gpus_per_node
        self.cpus_per_task, self.time_hours, self.timeout_hours = cpus_per_task, time_hours, timeout_hours
        self.checkpoint_signal, self.max_segments = checkpoint_signal, max_segments
        self.max_preemptions, self.requeue, self.exclude_nodes = max_preemptions, requeue, list(exclude_nodes)
        self.secret_env = validate_secret_env(secret_env)  # references only: the values are read at run time
        self.partition, self.account, self.extra_sbatch = partition, account, list(extra_sbatch)
        self.command, self.image, self.container_workdir = command, image, container_workdir
        self.container_mounts, self.leader_post_commands = list(container_mounts), list(leader_post_commands)
        self.environment = environment if environment is not None else {}  # an XComArg resolves as fields render
        self.pre_commands, self.post_commands = list(pre_commands), list(post_commands)
        self.inputs = list(inputs) if not isinstance(inputs, str) else [inputs]
        self.results_root, self.log_dir, self.config_path = results_root, log_dir, config_path
        self.sbatch_script = ""  # filled by render_template_fields: exactly what is submitted
        self._check_resources()

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """The base's, and the arguments the triggerer rebuilds this operator from (`start_from_trigger`)."""
        # DAG parse: the field's name only
        from npa_airflow.common.serialized_tasks import INIT_KWARGS_FIELD

        return frozenset(super().get_serialized_fields() | {INIT_KWARGS_FIELD})

    def execute_complete(
        self, context: Context, event: dict[str, Any] | None = None, run: dict[str, Any] | None = None
    ) -> Any:
        """The base's; or, when the triggerer handed the start to this worker, `execute`."""
        if self.started_on_worker(event):
            return self.execute(context)
        return super().execute_complete(context, event, run)

    def _check_resources(self) -> None:
        """Fail at DAG parse time for resource values and for a cluster option (neither is templated: the fields
        that are say where and what the job runs, and the paths it reads and writes)."""
        # DAG parse: the field rules (and the handle module they use) load only where a DAG makes this operator
        from npa_airflow.slurm.submit.spec_fields import check_request, int_field

        check_request(extra_sbatch=self.extra_sbatch, **self._resource_kwargs())
        int_field("max_preemptions", self.max_preemptions, 0, 100)

    def _resource_kwargs(self) -> dict[str, Any]:
        """The `SbatchSpec` resource fields (and the checkpoint warning): plain values, never templated."""
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "max_gpus_per_node": self.max_gpus_per_node,
            "cpus_per_task": self.cpus_per_task,
            "time_hours": self.time_hours,
            "timeout_hours": self.timeout_hours,
            "max_time_hours": None,  # checked against the real partition's MaxTime before submitting
            "requeue": self.requeue,
            "checkpoint_signal": self.checkpoint_signal,
            "max_segments": self.max_segments,
        }

    # -- spec and script ---------------------------------------------------------------------------------

    def spec_for(self, cfg: SlurmConnectionConfig, job_name: str, exclude_nodes: Sequence[str] = ()) -> SbatchSpec:
        """The bound spec of `job_name` under `cfg`, also keeping off `exclude_nodes` (an earlier try's bad nodes).

        This try's own job has the spec built when its fields rendered (`ThisTry.spec`); another name (an earlier
        try's job, to adopt or cancel it) or another config is built here.
        """
        this_try = self._this_try
        spec = this_try.spec if this_try is not None and this_try.hook.config is cfg else None
        if spec is None or spec.job_name != job_name:
            spec = self.build_spec(cfg, job_name)
        return spec.excluding(exclude_nodes) if exclude_nodes else spec

    def build_spec(self, cfg: SlurmConnectionConfig, job_name: str) -> SbatchSpec:
        """The bound `SbatchSpec` of `job_name` under the connection settings `cfg` (no I/O)."""
        # DAG parse: the naming, the spec and its container and placeholder modules are run-time only
        from npa_airflow.common.naming import first_segment_name, segment_of
        from npa_airflow.slurm.submit.spec import SbatchSpec

        root = results_root_for(cfg, self.results_root, self.slurm_conn_id)
        run_name = first_segment_name(job_name)  # every segment of a run keeps its results dir and record id
        results_dir = layout.results_dir(root, run_name)
        spec = SbatchSpec(
            job_name=job_name,
            command=self.command,
            log_dir=self.log_dir or f"{root}/slurm-logs",
            results_dir=results_dir,
            partition=self.partition or cfg.partition,
            account=self.account or cfg.account,
            image=self.image,
            container_mounts=tuple(self.container_mounts),
            container_workdir=self.container_workdir or None,
            inputs=tuple(self.mounted_paths(results_dir)),
            secret_env_names=tuple(sorted(self.secret_env)),
            environment=dict(self.environment) if isinstance(self.environment, Mapping) else self.environment,
            extra_sbatch=tuple(self.extra_sbatch),
            pre_commands=tuple(self.pre_commands),
            post_commands=tuple(self.post_commands),
            leader_post_commands=tuple(self.leader_post_commands),
            exclude_nodes=tuple(self.exclude_nodes),
            env_file=layout.sidecar_path(root, job_name) if self.secret_env else None,
            segment=segment_of(job_name),
            **self._resource_kwargs(),
        )
        return spec.bind(config_path=self.config_path, job_id=run_name, results_dir=results_dir)

    def required_inputs(self) -> list[str]:
        # DAG parse: the storage path rules are run-time only
        from npa_airflow.slurm.submit.storage_paths import normalize_storage_path

        return [normalize_storage_path(p, f"inputs[{i}]") for i, p in enumerate(self.inputs)]

    def mounted_paths(self, results_dir: str) -> list[str]:
        """What the job reads besides its results dir: the inputs, and a shared-storage `config_path` unless it is
        inside the results dir (then the job writes it). Each must exist before submission; a container sees each
        at the same path."""
        # DAG parse: the storage path rules are run-time only
        from npa_airflow.slurm.submit.storage_paths import STORAGE_SCHEMES, normalize_storage_path

        paths = self.required_inputs()
        if self.config_path and self.config_path.startswith(("/", *STORAGE_SCHEMES)):
            config = normalize_storage_path(self.config_path, "config_path")
            if not config.startswith(results_dir.rstrip("/") + "/"):
                paths.append(config)
        return list(dict.fromkeys(paths))

    def render_template_fields(self, context: Context, jinja_env: jinja2.Environment | None = None) -> None:
        super().render_template_fields(context, jinja_env)
        # DAG parse: the script builder and its templates are run-time only
        from npa_airflow.slurm.submit.scripts import render_sbatch

        self.required_inputs()  # reject local/file:// inputs before the task does anything else
        this_try = self.this_try(context)  # its hook reads the connection: once for the whole try
        this_try.spec = self.build_spec(this_try.hook.config, self.job_name_for_context(context))
        self.sbatch_script = render_sbatch(this_try.spec)
        self._warn_if_cut(len(self.sbatch_script))

    def _warn_if_cut(self, length: int) -> None:
        limit = conf.getint("core", "max_templated_field_length", fallback=4096)
        if length > limit:
            self.log.warning(
                "The rendered sbatch script has %d characters: Airflow's Rendered Template shows only its first %d "
                "([core] max_templated_field_length). Raise that setting to see all of it there; the job runs "
                "the whole script either way.",
                *(length, limit),
            )

    def job_environment(self, hook: SlurmHook) -> JobEnvironment:
        """The connection's settings (the hook's one read) and the resolved `secret_env` values."""
        secrets = resolve_secret_env(self.secret_env) if self.secret_env else {}
        self.mask_job_secrets(secrets.values())  # before anything of the job is logged in this process
        return JobEnvironment(config=hook.config, secrets=secrets)

    def secret_references(self) -> dict[str, str]:
        return dict(self.secret_env)

    def prepare_job(
        self, job_name: str, exclude_nodes: Sequence[str], env: JobEnvironment, step: Mapping[str, Any]
    ) -> PreparedJob:
        # DAG parse: the fit rules load the Slurm command builders; the script and staging builders are run-time only
        from npa_airflow.slurm.submit.fit import mem_mb_of
        from npa_airflow.slurm.submit.scripts import assert_script_clean, render_sbatch
        from npa_airflow.slurm.submit.staging import StagedFile

        spec = self.spec_for(env.config, job_name, exclude_nodes)
        script = render_sbatch(spec)
        secrets = dict(env.secrets)
        assert_script_clean(script, secrets.values())
        files: list[Any] = []
        if secrets and spec.env_file:
            body = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(secrets.items()))
            files.append(StagedFile(spec.env_file, body.encode("utf-8"), 0o600))
        root = spec.results_dir.rsplit("/", 1)[0]
        return PreparedJob(
            job_name=job_name,
            script=script,
            script_path=layout.script_path(root, job_name),
            results_dir=spec.results_dir,
            stdout_path=spec.stdout_path,
            stderr_path=spec.stderr_path,
            mkdirs=(*spec.log_dirs, spec.results_dir),
            required_paths=spec.inputs,
            files=tuple(files),
            wall_seconds=spec.time_minutes * 60,
            partition=spec.partition,
            time_minutes=spec.time_minutes,
            nodes=spec.nodes,
            gpus_per_node=spec.gpus_per_node,
            mem_mb=mem_mb_of(spec.extra_sbatch),
            secret_values=tuple(secrets.values()),
            env_file=spec.env_file,
        )

    def check_prepared_job(self, job: PreparedJob) -> None:
        """`bash -n` on the rendered script: a syntax error fails here, not after queueing."""
        # DAG parse: the script builder is run-time only
        from npa_airflow.slurm.submit.scripts import bash_syntax_check

        super().check_prepared_job(job)
        bash_syntax_check(job.script)

    def _show_submitted(self, job: PreparedJob) -> None:
        self.sbatch_script = job.script
