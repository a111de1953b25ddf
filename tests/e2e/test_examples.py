"""The example DAGs in the real Airflow: parsed by the dag-processor without errors, and slurm_train succeeds."""

from __future__ import annotations

from tests.e2e.airflow_api import poll

SLURM_EXAMPLES = ("slurm_train", "slurm_training")


def test_examples_parse_without_import_errors_in_the_running_airflow(api):
    for dag_id in SLURM_EXAMPLES:
        api.wait_for_dag(dag_id)
    errors = api.import_errors()  # both bundles: dags_examples/ and the e2e test DAGs
    assert errors == [], errors


def test_slurm_train_example_runs_to_success(api):
    run_id = api.trigger("slurm_train")
    ti = api.wait_for_state("slurm_train", run_id, "train", {"success"}, timeout=240)
    handle = api.xcom("slurm_train", run_id, "train", "slurm_job")
    assert handle and handle["job_id"], "the job handle is missing from XCom"
    lines = poll(lambda: api.log_lines("slurm_train", run_id, "train", ti["try_number"]), 10, "the task log")
    # Both nodes printed their rendezvous line into the task log (streamed by the trigger).
    rendezvous = [line for line in lines if line.startswith("rendezvous node=")]
    assert {line.split("NODE_RANK=")[1].split()[0] for line in rendezvous} == {"0", "1"}, lines
