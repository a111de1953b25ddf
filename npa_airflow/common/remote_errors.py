"""Named predicates over what remote tools say when they fail: the only place their error text is matched.

Each predicate is tested on recorded output (tests/unit/common/test_remote_errors.py). When a Slurm or
SkyPilot release rewords a message, this module and its samples change together.
"""

from __future__ import annotations

# scontrol/sacct/squeue/sbatch when slurmctld (or slurmdbd behind sacct) did not answer: the request itself may
# be fine, asking again later may succeed.
_CONTROLLER_UNREACHABLE = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Connection refused",
    "Zero Bytes",
)

# scancel's answers for a job that has nothing left to cancel (ended, or purged after MinJobAge).
_NOTHING_TO_CANCEL = (
    "already completing or completed",
    "invalid job id specified",
    "job/step already completing",
)

# SkyPilot exception class names (``error_type``) that mean the cluster is not there any more.
_SKYPILOT_CLUSTER_GONE = ("ClusterDoesNotExist", "ClusterNotUpError")

# HTTP answers of a proxy or an overloaded API server: the request did not run, resending is safe.
_TRANSIENT_HTTP_STATUS = (429, 502, 503, 504)


def slurmctld_unreachable(text: str) -> bool:
    """The controller, not the request, failed: worth asking again."""
    return any(marker in text for marker in _CONTROLLER_UNREACHABLE)


def sbatch_outcome_unknown(text: str) -> bool:
    """sbatch gave up waiting for slurmctld's answer: the job may or may not exist (reconcile by name)."""
    return slurmctld_unreachable(text) or "timed out" in text


def squeue_job_id_unknown(stderr: str) -> bool:
    """squeue's answer when the ONLY id asked for is unknown to slurmctld (purged after MinJobAge): rc 1.

    With several ids squeue silently omits the unknown ones and exits 0 (Slurm 22.05).
    """
    return "Invalid job id specified" in stderr


def sacct_accounting_disabled(stderr: str) -> bool:
    """sacct on a cluster without accounting storage (no slurmdbd): it never answers there, asking again is useless."""
    return "accounting storage is disabled" in stderr.lower()


def scancel_nothing_to_cancel(stderr: str) -> bool:
    """scancel refused because the job already ended or was purged: for us that is a successful cancel."""
    text = stderr.lower()
    return any(marker in text for marker in _NOTHING_TO_CANCEL)


def skypilot_cluster_gone(error_type: str | None) -> bool:
    """SkyPilot says the cluster does not exist or is not up: nothing left to cancel or tear down."""
    return error_type in _SKYPILOT_CLUSTER_GONE


def skypilot_cluster_missing(error_type: str | None) -> bool:
    """SkyPilot says the cluster does not exist at all (teardown has nothing to do)."""
    return error_type == "ClusterDoesNotExist"


def http_status_transient(status_code: int) -> bool:
    """The API server (or a proxy in front of it) did not run the request: resending is safe."""
    return status_code in _TRANSIENT_HTTP_STATUS
