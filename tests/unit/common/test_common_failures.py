"""common/failures.py: the one scan of a log tail for infrastructure lines, and its evidence, that both backends'
verdicts (Slurm's `classify`, Burst's `classify_burst_failure`) read."""

from __future__ import annotations

from npa_airflow.common.failures import MAX_EVIDENCE_LINE, MAX_EVIDENCE_LINES, evidence_parts, infra_lines

NCCL = "  g2:18231:18290 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion with error 12" + " x" * 200


def test_a_matching_line_is_kept_whole_and_its_evidence_is_cut_short():
    matches = infra_lines(f"step 10\n{NCCL}\nloss 0.2\n")
    assert matches == [("NCCL transport error", NCCL.strip())]
    (part,) = evidence_parts(matches)
    assert part == f"NCCL transport error: {NCCL.strip()[:MAX_EVIDENCE_LINE]}"


def test_the_evidence_holds_the_first_lines_only():
    tail = "\n".join(f"RuntimeError: No CUDA GPUs are available ({i})" for i in range(MAX_EVIDENCE_LINES + 2))
    assert len(infra_lines(tail)) == MAX_EVIDENCE_LINES + 2
    assert len(evidence_parts(infra_lines(tail))) == MAX_EVIDENCE_LINES


def test_both_backends_word_the_same_evidence():
    from npa_airflow.burst.outcome import classify_burst_failure
    from npa_airflow.common.states import JobState
    from npa_airflow.slurm.commands import SlurmJobInfo
    from npa_airflow.slurm.watch.failures import classify

    info = SlurmJobInfo(
        job_id="7", native_state="FAILED", state=JobState.ERROR, exit_code=1, signal=0,
        job_name="n", node_list="g2", reason=None, source="sacct",
    )  # fmt: skip
    slurm, burst = classify(info, NCCL), classify_burst_failure("FAILED", "job 7 ended FAILED", NCCL)
    assert slurm.is_infra and burst.is_infra and slurm.evidence == burst.evidence
    assert slurm.bad_nodes == ("g2",)
