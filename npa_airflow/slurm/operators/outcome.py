"""Reading a failed job's outcome: its classification (infrastructure or program) and the end of its log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from npa_airflow.common.states import JobState
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.watch.failures import classify

if TYPE_CHECKING:
    from npa_airflow.slurm.handle import SlurmJobHandle
    from npa_airflow.slurm.hook import SlurmHook
    from npa_airflow.slurm.watch.failures import FailureVerdict

LOG_TAIL_BYTES = 8192


def classify_failure(event: dict[str, Any], job_name: str, tail: str) -> FailureVerdict:
    """Infrastructure or program failure (with evidence and bad nodes) from the final state and the log tail."""
    info = SlurmJobInfo(
        job_id=str(event["job_id"]),
        native_state=str(event.get("native_state") or "UNKNOWN"),
        state=JobState(event.get("state") or "ERROR"),
        exit_code=event.get("exit_code"),
        signal=event.get("signal"),
        job_name=job_name,
        node_list=event.get("node_list"),
        reason=event.get("reason"),
        source="event",
    )
    return classify(info, tail)


def read_log_tail(hook: SlurmHook, handle: SlurmJobHandle) -> str:
    """The last LOG_TAIL_BYTES of the job's stdout (and stderr, if apart), each under a label."""
    paths = list(dict.fromkeys([handle.stdout_path, handle.stderr_path]))
    sizes = hook.tail_logs([(p, 0) for p in paths], max_bytes=1)
    requests = [(c.path, max(0, c.size - LOG_TAIL_BYTES)) for c in sizes if c.size > 0]
    chunks = hook.tail_logs(requests, max_bytes=LOG_TAIL_BYTES) if requests else []
    parts = []
    for chunk in chunks:
        text = chunk.data.decode("utf-8", errors="replace")
        label = "stderr" if chunk.path == handle.stderr_path and len(paths) > 1 else "stdout"
        parts.append(f"[{label} {chunk.path}]\n{text.rstrip()}")
    return "\n".join(parts)
