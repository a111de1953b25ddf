"""Infrastructure or program? A failed burst wait in the vocabulary the Slurm side uses (``common.failures``).

The job's own failure (SkyPilot state FAILED or FAILED_SETUP) is the program's, unless the end of its log shows an
infrastructure pattern (an NCCL transport error, an Xid, ...). Everything else is infrastructure and worth
another try: a launch that could not provision, a cluster that went away under the job, SkyPilot's job driver
dying with its node (FAILED_DRIVER).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npa_airflow.burst import client as sky
from npa_airflow.common.failures import FailureVerdict, evidence_parts, infra_lines
from npa_airflow.common.states import JobState

if TYPE_CHECKING:
    import logging

    from npa_airflow.burst.handle import BurstJobHandle
    from npa_airflow.burst.hook import SkyPilotHook

LOG_TAIL_LINES = 50
DRIVER_FAILED = "FAILED_DRIVER"


def classify_burst_failure(native_state: str | None, message: str, log_tail: str) -> FailureVerdict:
    """The verdict on a ``failed`` event from its job's native state, its message and the job's log tail."""
    if sky.interpret_job_state(native_state) is not JobState.ERROR:
        return FailureVerdict("infra", message)  # no job ended by itself: the launch or the cluster failed
    if (native_state or "").upper() == DRIVER_FAILED:
        return FailureVerdict("infra", f"{message}: SkyPilot's job driver died (its node or runtime failed)")
    matches = infra_lines(log_tail)
    if matches:
        return FailureVerdict("infra", "; ".join(evidence_parts(matches)))
    return FailureVerdict("program", f"{message}; no infrastructure pattern in the log tail")


def read_log_tail(hook: SkyPilotHook, handle: BurstJobHandle, log: logging.Logger) -> str:
    """The last lines of the job's log ('' when there is no job or it cannot be read)."""
    if handle.job_id is None:
        return ""
    try:
        return hook.job_log_tail(handle.cluster, handle.job_id, LOG_TAIL_LINES)
    except Exception as exc:  # the tail only explains the failure; it must not replace it
        log.warning("Could not read the end of the log of burst job %s: %s", handle.job_id, exc)
        return ""
