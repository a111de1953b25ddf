"""Starting a Slurm task in the triggerer (`start_from_trigger=True`): no worker on the way in, none on success.

The scheduler defers such a task straight to `npa_airflow.slurm.start_trigger.SlurmStartTrigger`, which rebuilds
the operator (`npa_airflow.common.serialized_tasks`), renders it, runs the same start as the worker's `execute`
(checks, adopt or submit, the handle to XCom) and waits for the job, then ends the task there when the job
succeeded. Everything else resumes on a worker in `execute_complete`, as a deferred task does: a failure is
classified there (retry with the bad nodes excluded, or not), a segment continues there, and a start the
triggerer cannot do (a later try, an argument it cannot rebuild, a refusal) runs `execute` there.
"""

from __future__ import annotations

from typing import Any

from airflow.triggers.base import StartTriggerArgs

from npa_airflow.exceptions import NpaValidationError

START_ON_WORKER = "start_on_worker"  # the status of the event by which the trigger hands the start to a worker
START_TRIGGER_ARGS = StartTriggerArgs(
    trigger_cls="npa_airflow.slurm.start_trigger.SlurmStartTrigger",
    trigger_kwargs={},  # the trigger reads everything from the task instance: nothing of the task in the row
    next_method="execute_complete",
    next_kwargs=None,
    timeout=None,
)


class StartsInTriggerer:
    """Mixed into an operator of `SlurmJobOperatorBase`: the `start_from_trigger` option and the worker's half."""

    start_trigger_args = START_TRIGGER_ARGS
    start_from_trigger: bool
    deferrable: bool

    def use_start_from_trigger(self, start_from_trigger: bool) -> None:
        """Set the option (Airflow's BaseOperator takes no such argument); it needs the deferrable wait."""
        if start_from_trigger and not self.deferrable:
            raise NpaValidationError(
                "start_from_trigger=True starts the task in the triggerer and waits there: it needs "
                "deferrable=True (drop deferrable=False, or start_from_trigger)"
            )
        self.start_from_trigger = bool(start_from_trigger)

    @property
    def npa_init_kwargs(self) -> str | None:
        """The serialized field the triggerer rebuilds this operator from (None without `start_from_trigger`)."""
        # DAG parse: read only when the DAG is serialized
        from npa_airflow.common.serialized_tasks import init_kwargs_json

        return init_kwargs_json(self) if self.start_from_trigger else None  # type: ignore[arg-type]

    def started_on_worker(self, event: dict[str, Any] | None) -> bool:
        """Whether `event` hands the start to this worker (then `execute` runs here)."""
        if not isinstance(event, dict) or event.get("status") != START_ON_WORKER:
            return False
        self.log.info("Starting on this worker: %s", event.get("message") or "the triggerer did not start it")  # type: ignore[attr-defined]
        return True
