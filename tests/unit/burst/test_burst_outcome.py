"""Infrastructure or program (burst/outcome.py): the Slurm side's vocabulary for a failed burst wait."""

from __future__ import annotations

from npa_airflow.burst.outcome import classify_burst_failure


def test_a_job_that_failed_by_itself_is_the_programs_failure():
    verdict = classify_burst_failure("FAILED", "job 1 ended FAILED", "Traceback ...\nValueError: bad config")
    assert (verdict.kind, verdict.evidence) == (
        "program",
        "job 1 ended FAILED; no infrastructure pattern in the log tail",
    )
    assert classify_burst_failure("FAILED_SETUP", "setup failed", "").kind == "program"


def test_infrastructure_evidence_in_the_log_makes_it_retryable():
    line = "g1:123:456 [0] NCCL WARN NET/IB : Got completion with error 12"
    verdict = classify_burst_failure("FAILED", "job 1 ended FAILED", f"step 10\n{line}\n")
    assert (verdict.kind, verdict.evidence) == ("infra", f"NCCL transport error: {line}")


def test_launch_failures_lost_clusters_and_dead_drivers_are_infrastructure():
    assert classify_burst_failure(None, "launch of cluster c failed: ResourcesUnavailableError", "").is_infra
    assert classify_burst_failure("RUNNING", "cluster c is gone", "").is_infra
    assert classify_burst_failure("FAILED_DRIVER", "job 1 ended FAILED_DRIVER", "").is_infra
