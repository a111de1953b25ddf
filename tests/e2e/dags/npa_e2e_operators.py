"""An operator of the e2e DAGs, in a module of its own: the triggerer imports it by name to start a task
(`start_from_trigger`), so it cannot live in a DAG file. The e2e deployments have this folder on PYTHONPATH."""

from __future__ import annotations

import time

from npa_airflow.slurm.operators import SlurmSubmitOperator


class LingeringSubmitOperator(SlurmSubmitOperator):
    """SlurmSubmitOperator that waits where it submitted (a worker, or the triggerer) between the submission and
    the handle's XCom push, on its first try, for a job it has just submitted (not one it adopted)."""

    def _adopt_or_submit(self, context, *args, **kwargs):
        handle = super()._adopt_or_submit(context, *args, **kwargs)
        just_submitted = handle.submitted_at is not None and time.time() - handle.submitted_at < 15
        if context["ti"].try_number == 1 and just_submitted:
            linger = float(context["params"]["linger"])
            self.log.info("Submitted job %s; lingering %.0f s before the handle reaches XCom", handle.job_id, linger)
            time.sleep(linger)
        return handle
