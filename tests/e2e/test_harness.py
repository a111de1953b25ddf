"""The harness itself: a plain BashOperator run through the REST API, its log read back in order."""

from __future__ import annotations


def test_bash_task_runs_and_its_log_reads_back_in_order(api):
    api.wait_for_dag("npa_e2e_bash")
    run_id = api.trigger("npa_e2e_bash")
    ti = api.wait_for_state("npa_e2e_bash", run_id, "count", {"success"}, timeout=120)
    lines = api.log_lines("npa_e2e_bash", run_id, "count", ti["try_number"])
    printed = [line for line in lines if line.startswith("npa-line-")]
    assert printed == ["npa-line-1", "npa-line-2", "npa-line-3"], lines
