"""SlurmJobTrigger: wait for a Slurm job in the triggerer, streaming its stdout/stderr into the task log.

The trigger does no polling of its own: it registers with the process-wide poller of its job's cluster
(`npa_airflow.slurm.watch.poller`), which queries all waiting jobs of that cluster in one command per cycle.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from typing import Any

from npa_airflow.common.naming import identity_hash
from npa_airflow.common.ownership import Claim, warm_task_reads
from npa_airflow.common.retry import Backoff, Budget, aretry
from npa_airflow.common.secret_env import amask_secret_env, validate_secret_env
from npa_airflow.common.secret_masking import redact_text
from npa_airflow.common.states import JobState
from npa_airflow.common.trigger_rows import as_trigger_row
from npa_airflow.slurm.commands import without_accounting
from npa_airflow.slurm.commands.offsets import claim_file_for, offsets_file_for
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.submit.fit import never_clearing_reason
from npa_airflow.slurm.watch.log_lines import LogFileLines
from npa_airflow.slurm.watch.poller import PollUpdate, Registration, SlurmPoller, get_poller
from npa_airflow.slurm.watch.state_log import JobStateLog
from npa_airflow.slurm.watch.trigger_cancel import SlurmTriggerCancels
from npa_airflow.slurm.watch.trigger_events import ENDED_FIRST, usage_fields

# Re-exported: operators, sensors and tests import the event helpers from here.
from npa_airflow.slurm.watch.trigger_events import EVENT_STATUSES as EVENT_STATUSES
from npa_airflow.slurm.watch.trigger_events import event_handle as event_handle
from npa_airflow.slurm.watch.trigger_events import make_event_payload as make_event_payload
from npa_airflow.slurm.watch.trigger_events import validate_event as validate_event

TAIL_LINES = 60  # lines of the job's output carried in a failure event
# A job that sacct and squeue both answer they do not know, for this long in a row, is lost: the wait ends.
VANISHED_AFTER_SECONDS = 600.0
# Between checks of the success marker: 2, 4, 8, ... 60 s, until the deadline.
MARKER_CHECK_BACKOFF = Backoff(base=2.0, cap=60.0, jitter=0.0)


class SlurmJobTrigger(SlurmTriggerCancels):
    """Fire one event when Slurm job `handle.job_id` ends, or when `deadline` (epoch seconds) passes.

    :param handle: the job handle dict (`SlurmJobHandle.to_dict()`): the trigger row and the events keep it as a
        dict, the trigger itself holds the `SlurmJobHandle` (`self.handle`).
    :param conn_id: the Slurm connection.
    :param poll_interval: wanted seconds between polls while running (the poller never goes below its floor).
    :param deadline: epoch seconds after which the trigger fires a "deadline" event (the operator cancels).
    :param require_marker: for COMPLETED, also require this file (relative to the results dir, or absolute).
    :param log_offsets: ignored; accepted so trigger rows serialised by earlier versions (which carried it)
        still deserialise. The offsets live next to the job's stdout (`npa_airflow.slurm.commands.offsets`).
    :param stream_logs: write the job's stdout/stderr to the task log as it appears.
    :param cancel_on_kill: scancel the job when a user kills the deferred task.
    :param secret_env: the job's `secret_env` references ({ENV_NAME: "var:NAME" | "conn:ID[:field]"}, never
        values): resolved here and registered with this process's secrets masker before any line of the job's
        output is written, so a job that prints a secret shows ``***`` in the task log and the event's log tail.
    :param continue_file: a segment of a long run (`npa_airflow.slurm.operators.segments`): when the job ends (not
        cancelled) with this file present, the event is "continue" whatever Slurm says, and the worker submits the
        next segment.
    :param vanished_after: seconds after which a job that sacct and squeue both keep answering they do not know
        (purged, lost by the cluster, or on another cluster) ends the wait with a "vanished" event, instead of
        waiting for the deadline. Only answers count: while either tool fails, the job is not "absent".
    """

    def __init__(
        self,
        handle: dict[str, Any],
        conn_id: str,
        poll_interval: float = 15.0,
        deadline: float | None = None,
        require_marker: str | None = None,
        log_offsets: dict[str, int] | None = None,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        secret_env: dict[str, str] | None = None,
        vanished_after: float = VANISHED_AFTER_SECONDS,
        continue_file: str | None = None,
    ) -> None:
        super().__init__(deadline, cancel_on_kill)
        # a handle from XCom or a trigger row is validated like a new one
        self.handle = SlurmJobHandle.from_dict(handle)
        self.conn_id = conn_id
        self.poll_interval = float(poll_interval)
        self.require_marker = require_marker
        self.log_offsets: dict[str, int] = {}  # what the task log holds so far; reported in the event
        self.stream_logs = stream_logs
        self.secret_env = validate_secret_env(secret_env)
        self._secret_values: tuple[str, ...] | None = None  # resolved already (the worker-side wait)
        self.vanished_after = float(vanished_after)
        self.continue_file = continue_file
        self._registration: Registration | None = None
        self._claim_file: str | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._state_log = JobStateLog(self.handle.job_id, lambda: self.log)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # `handle` is stored as its dict (as_trigger_row): the row keeps the shape earlier releases wrote
        names = (
            "handle",
            "conn_id",
            "poll_interval",
            "deadline",
            "require_marker",
            "stream_logs",
            "cancel_on_kill",
            "vanished_after",
            "secret_env",
            "continue_file",
        )
        return as_trigger_row(self, names)

    # -- paths -------------------------------------------------------------------------------------------

    @property
    def job_id(self) -> str:
        return self.handle.job_id

    @property
    def job_label(self) -> str:
        return f"Slurm job {self.job_id}"

    def _poller(self) -> SlurmPoller:
        """The poller of the job's cluster: every state query and scancel of this trigger names that cluster."""
        return get_poller(self.conn_id, cluster=self.handle.cluster)

    def log_paths(self) -> list[tuple[str, str]]:
        """(label, path) for each distinct log file of the job."""
        out = [("stdout", self.handle.stdout_path)]
        if self.handle.stderr_path != self.handle.stdout_path:
            out.append(("stderr", self.handle.stderr_path))
        return out

    def marker_path(self) -> str | None:
        if not self.require_marker:
            return None
        if self.require_marker.startswith("/"):
            return self.require_marker
        return f"{self.handle.results_dir.rstrip('/')}/{self.require_marker}"

    def fallback_try(self) -> int:
        return self.handle.try_number

    async def record_claim(self, ti: Any, claim: Claim) -> bool:
        """The poller writes the claim next to the job's stdout with its first command after registration."""
        key = identity_hash(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", -1))
        self._claim_file = claim_file_for(self.handle.stdout_path, key)
        return True

    # -- run ---------------------------------------------------------------------------------------------

    def use_resolved_secrets(self, values: Iterable[str]) -> None:
        """The worker-side wait: the operator has resolved the `secret_env` values already (never in kwargs)."""
        self._secret_values = tuple(values)

    async def _mask_secrets(self) -> bool:
        """Register the `secret_env` values with this process's secrets masker before any output is written.

        False when they cannot be read: the job's output is then not copied here at all (nothing unmasked).
        """
        if not self.secret_env:
            return True
        try:
            await amask_secret_env(self.secret_env, self._secret_values)
        except Exception as exc:
            refs = ", ".join(f"{name}={ref}" for name, ref in self.secret_env.items())
            self.log.warning(
                "Slurm job %s: its output is not copied into this log: the secret_env values (%s) could not be "
                "read to mask them: %s",
                self.job_id,
                refs,
                exc,
            )
            return False
        return True

    async def wait(self) -> dict[str, Any]:
        """Follow the job through the cluster's poller, copying its output here, until an event ends the wait."""
        poller = self._poller()
        masked = await self._mask_secrets()
        paths = self.log_paths() if self.stream_logs and masked else []
        warm_task_reads(getattr(self, "task_instance", None))
        reg = self._registration = self._register(poller, [p for _, p in paths])
        labels = {p: label for label, p in paths}
        splitters: dict[str, LogFileLines] = {}
        self.log.info("Waiting for Slurm job %s (%s)", self.job_id, self.handle.job_name)
        try:
            while True:
                update = await self._next_update(reg)
                if update is not None and (update.state.is_terminal or any(c.data for c in update.chunks)):
                    await poller.claim_still_held(reg, update.claims_read_at)  # lines to write: still ours?
                if reg.superseded:
                    await self._stand_down(reg)
                if update is None:
                    return await self._event_without_update()
                self._write_logs(update, reg, labels, splitters)
                reg.ack(update.cycle)
                event = await self._event_for(update, reg, labels, splitters)
                if event is not None:
                    return event
        finally:
            poller.unregister(reg)

    def _register(self, poller: SlurmPoller, paths: list[str]) -> Registration:
        """Join the poller: the job, the log files to copy (offsets kept next to its stdout), the claim."""
        return poller.register(
            self.job_id,
            log_offsets=[(p, 0) for p in paths],
            offsets_file=offsets_file_for(self.handle.stdout_path) if paths else None,
            interval=self.poll_interval,
            submitted_at=self.handle.submitted_at,
            claim=self._claim,
            claim_file=self._claim_file,
            shred_on_end=self.handle.secret_files,
            end_record=self.handle.end_record,
        )

    async def _event_for(
        self, update: PollUpdate, reg: Registration, labels: dict[str, str], splitters: dict[str, LogFileLines]
    ) -> dict[str, Any] | None:
        """The event `update` ends the wait with; None while the wait goes on."""
        self._state_log.note(update)
        if update.absent_for is not None and update.absent_for >= self.vanished_after:
            return self._vanished_event(update.absent_for)
        if update.state is JobState.PENDING and update.info is not None:
            never = never_clearing_reason(update.info.reason)
            if never is not None:
                return await self._unsatisfiable_event(never, update.info.reason or never)
        if update.state.is_terminal and update.logs_drained:
            self._flush_logs(reg, labels, splitters)
            event = await self._terminal_event(update)
            if event is None:  # the success marker could not be checked before the deadline
                return await self._deadline_event(f"Slurm job {self.job_id}: deadline passed")
            return event
        if self._deadline_passed():
            return await self._deadline_event(f"Slurm job {self.job_id} still not finished at its deadline")
        return None

    def _vanished_event(self, absent_for: float) -> dict[str, Any]:
        last = self._state_log.last_seen
        seen = f", last seen {last[0].value}" if last else ", never seen by this wait"
        message = (
            f"Slurm job {self.job_id} ({self.handle.job_name}) is lost: neither sacct nor squeue on "
            f"{self.handle.login_host} has known it for {absent_for / 60:.0f} min{seen}. The cluster may "
            "have lost it (slurmctld state reset), or it runs on another cluster than the connection's"
        )
        return self._fire("vanished", message)

    async def _stand_down(self, reg: Registration) -> None:
        """Another trigger has claimed the job: fire nothing, write nothing, wait to be cancelled."""
        self.log.warning(
            "Slurm job %s is now watched by another trigger (%s); this one stands down", self.job_id, reg.superseded_by
        )
        await asyncio.Event().wait()

    async def cleanup(self) -> None:
        """Keep the log position for the next triggerer (never cancels the job)."""
        reg = self._registration
        if reg is not None and not self._fired and not reg.superseded:
            await self._poller().flush_offsets(reg)

    async def _next_update(self, reg: Registration) -> PollUpdate | None:
        remaining = self._seconds_left()
        if remaining is None:
            return await reg.queue.get()
        if remaining <= 0:
            return None
        try:
            return await asyncio.wait_for(reg.queue.get(), remaining)
        except asyncio.TimeoutError:  # a distinct class before Python 3.11
            return None

    def _log_line(self, label: str, line: str) -> None:
        line = redact_text(line)  # the task log and the event's tail (stored with the task) never hold a secret
        self._tail.append(line if label == "stdout" else f"[stderr] {line}")
        if label == "stdout":
            self.log.info("%s", line)
        else:
            self.log.info("[stderr] %s", line)

    def _write_logs(
        self,
        update: PollUpdate,
        reg: Registration,
        labels: dict[str, str],
        splitters: dict[str, LogFileLines],
    ) -> None:
        for chunk in update.chunks:
            if not chunk.data:
                continue
            splitter = splitters.get(chunk.path)
            if splitter is None:
                splitter = splitters[chunk.path] = LogFileLines(chunk.offset - len(chunk.data))
            for line in splitter.feed(chunk.data, chunk.offset):
                self._log_line(labels.get(chunk.path, "stdout"), line)
            reg.commit(chunk.path, splitter.committed)
        self.log_offsets = {c.path: c.committed for c in reg.cursors}

    def _flush_logs(self, reg: Registration, labels: dict[str, str], splitters: dict[str, LogFileLines]) -> None:
        """The job ended and its logs are read to the end: write each file's partial last line too."""
        for path, splitter in splitters.items():
            for line in splitter.flush():
                self._log_line(labels.get(path, "stdout"), line)
            reg.commit(path, splitter.committed)
        self.log_offsets = {c.path: c.committed for c in reg.cursors}

    async def _terminal_event(self, update: PollUpdate) -> dict[str, Any] | None:
        info = update.info
        details: dict[str, Any] = {
            "state": update.state.value,
            "native_state": info.native_state if info else None,
            "exit_code": info.exit_code if info else None,
            "signal": info.signal if info else None,
            "node_list": info.node_list if info else None,
            "reason": info.reason if info else None,
            "log_tail": "\n".join(self._tail),
            **usage_fields(info, accounting=update.accounting),
        }
        native = details["native_state"]
        if self.continue_file and update.state is not JobState.CANCELED:
            asked = await self._path_exists(self.continue_file)
            if asked is None:
                return None
            if asked:
                message = f"Slurm job {self.job_id} ended {native} and asked to be continued ({self.continue_file})"
                return self._fire("continue", message, **details)
        if update.state is JobState.COMPLETE:
            marker = self.marker_path()
            if marker:
                found = await self._path_exists(marker)
                if found is None:
                    return None
                if not found:
                    return self._fire(
                        "marker_missing",
                        f"Slurm job {self.job_id} ended COMPLETED but its success marker {marker} is missing",
                        marker=marker,
                        **details,
                    )
            return self._fire("success", f"Slurm job {self.job_id} COMPLETED", **details)
        if update.state is JobState.CANCELED:
            return self._fire("canceled", f"Slurm job {self.job_id} ended {native}", **details)
        message = f"Slurm job {self.job_id} ended {native} (exit code {details['exit_code']})"
        if info is not None and info.source == without_accounting.SOURCE and info.exit_code is None and info.reason:
            message = f"{message}: {info.reason}"  # a cluster without accounting lost how it ended: say so
        return self._fire("failed", message, **details)

    async def _path_exists(self, path: str) -> bool | None:
        """Whether the job's success marker or continue file exists: True/False, or None when the deadline passed
        before the cluster could answer."""
        checks = self._poller().channel.path_checks  # one command for every job that ended in the same cycle

        def retry_before_deadline(exc: BaseException) -> bool:
            self.log.warning("Could not check %s (%s); retrying", path, exc)
            return not self._deadline_passed()

        try:
            return bool(
                await aretry(
                    lambda: checks.get(path),
                    transient=retry_before_deadline,
                    backoff=MARKER_CHECK_BACKOFF,
                    budget=Budget(),
                )
            )
        except Exception:  # only once the deadline passed: every failure before it is retried
            return None

    async def _event_without_update(self) -> dict[str, Any]:
        """The wait ended with no poll update: the deadline passed (a subclass may stop waiting for its own reason)."""
        return await self._deadline_event(f"Slurm job {self.job_id} still not finished at its deadline")

    def event_payload(self, status: str, message: str, **extra: Any) -> dict[str, Any]:
        offsets = dict(self.log_offsets)
        # Only the job's end tells its usage (_terminal_event); a wait that ends first (deadline, never-clearing
        # reason, lost job) cannot know what the job will have used.
        if "usage" not in extra:
            extra = {**extra, "usage": None, "usage_unknown": ENDED_FIRST}
        return make_event_payload(status, self.handle.to_dict(), message, log_offsets=offsets, **extra)
