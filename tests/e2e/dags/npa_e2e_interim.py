"""Interim: a minimal submit-and-defer task on the real hook and SlurmJobTrigger (until SlurmSubmitOperator)."""

from __future__ import annotations

import shlex
import time

from airflow.sdk import DAG, BaseOperator


class _SubmitTicker(BaseOperator):
    template_fields = ("script",)
    overwrite_rtif_after_execution = True

    @property
    def operator_extra_links(self):
        from npa_airflow.common.links import SlurmJobLink

        return (SlurmJobLink(),)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.script = ""

    def execute(self, context):
        from npa_airflow.common.handle import SlurmJobHandle
        from npa_airflow.common.naming import job_name_for
        from npa_airflow.slurm.hook import SlurmHook
        from npa_airflow.slurm.triggers import SlurmJobTrigger

        ti = context["ti"]
        seconds = int(context["dag_run"].conf.get("seconds", 40))
        hook = SlurmHook("slurm_default")
        name = job_name_for(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, ti.try_number)
        rdir = f"{hook.config.results_root}/{name}"
        out = f"{rdir}/main.out"
        self.script = (
            f"#!/bin/bash\n#SBATCH -J {name}\n#SBATCH -p cpu\n#SBATCH -c 1\n#SBATCH -t 10\n"
            f"#SBATCH -o {out}\n#SBATCH -e {rdir}/main.err\n"
            f'for i in $(seq 1 {seconds}); do echo "tick $i of {seconds}"; sleep 1; done\n'
        )
        hook.run(["mkdir", "-p", rdir])
        hook.write_file(f"{rdir}/job.sbatch", self.script.encode(), 0o700)
        sub = hook.submit(f"{rdir}/job.sbatch")
        handle = SlurmJobHandle(
            conn_id="slurm_default",
            cluster=sub.cluster,
            job_id=sub.job_id,
            job_name=name,
            login_host="127.0.0.1",
            results_dir=rdir,
            stdout_path=out,
            stderr_path=f"{rdir}/main.err",
            try_number=ti.try_number,
            submitted_at=time.time(),
        ).to_dict()
        ti.xcom_push(key="slurm_job", value=handle)
        self.log.info("submitted %s", shlex.quote(sub.job_id))
        self.defer(
            trigger=SlurmJobTrigger(handle=handle, conn_id="slurm_default", poll_interval=2),
            method_name="execute_complete",
        )

    def execute_complete(self, context, event):
        if event["status"] != "success":
            raise RuntimeError(event["message"])
        return event["handle"]


with DAG(dag_id="npa_e2e_interim", schedule=None, catchup=False):
    _SubmitTicker(task_id="ticker")
