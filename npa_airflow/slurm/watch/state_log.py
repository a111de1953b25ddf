"""What a job's wait says in the task log about the job's state (pure, but for the logger it writes to).

A state is logged when it, or the pending reason, changes: "PENDING (Resources)" says why the job waits. A requeue
(preemption, node failure, scontrol requeue) is said once: PENDING in squeue after the job ran, or PENDING in sacct
after sacct itself said RUNNING (its record of the requeued job). Accounting lags behind a job that just started
(sacct PENDING after squeue RUNNING), so sacct's PENDING after squeue's RUNNING is not taken for a requeue until
squeue says it too. Failed polls are logged the first time in a row and every tenth.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from npa_airflow.common.states import JobState
from npa_airflow.slurm.watch.poll_records import PollUpdate


class JobStateLog:
    """`log` gives the logger to write to at each line: a trigger's is set after it is made (the task's log)."""

    def __init__(self, job_id: str, log: Callable[[], logging.Logger]) -> None:
        self.job_id, self._log = job_id, log
        self.last_seen: tuple[JobState, str | None] | None = None  # state and pending reason last logged
        self._ran = False  # seen running since the last requeue
        self._ran_in_accounting = False  # ... and sacct said so: a later PENDING in sacct is then no lag
        self._problems = 0  # polls in a row that failed

    def note(self, update: PollUpdate) -> None:
        """Log what `update` says that the log has not said yet."""
        self._note_problem(update.error)
        info = update.info
        if info is None:
            return
        requeued = self._requeued(update.state, info.source)
        reason = info.reason if update.state is JobState.PENDING else None
        if (update.state, reason) != self.last_seen:
            self.last_seen = (update.state, reason)
            why = f", reason {reason}" if reason else ""
            self._log().info("Slurm job %s is %s (%s%s)", self.job_id, info.native_state, update.state.value, why)
        if requeued:
            self._log().warning(
                "Slurm job %s was requeued (preempted, a node failure or scontrol requeue; Slurm's reason: %s): it "
                "stays this task's job and runs its script again, so a command that checkpoints resumes from its "
                "checkpoint (the job's output says which restart it is)",
                *(self.job_id, info.reason or "none given"),
            )

    def _requeued(self, state: JobState, source: str) -> bool:
        """Whether `state` (read from `source`) says the job went back to the queue after it was seen running.

        Checked at every update, a state already logged too: a PENDING that sacct said first (read as its lag)
        is a requeue once squeue, asked at the next cycle for a job last seen pending, says it too.
        """
        if state is JobState.RUNNING:
            self._ran = True
            self._ran_in_accounting = self._ran_in_accounting or source == "sacct"
            return False
        if state is not JobState.PENDING or not self._ran:
            return False
        if source != "squeue" and not self._ran_in_accounting:
            return False
        self._ran = self._ran_in_accounting = False
        return True

    def _note_problem(self, error: str | None) -> None:
        if not error:
            self._problems = 0
            return
        self._problems += 1
        if self._problems == 1 or self._problems % 10 == 0:
            self._log().warning("Slurm job %s: %s", self.job_id, error)
