"""The Compute page's pure parts: resources from the rendered script, one query per cluster, rows, totals, filters."""

from __future__ import annotations

import pytest

from npa_airflow.compute import rows as r

SCRIPT = """#!/bin/bash
#SBATCH --job-name=npa-x
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks=2
#SBATCH --exclusive
#SBATCH --gres=gpu:8
#SBATCH --time=15
set -euo pipefail
#SBATCH --partition=ignored-after-the-first-command
"""


def slurm_task(
    job_id="101", *, dag="d1", cluster=None, conn="slurm_default", state="deferred", script=SCRIPT, at=1000.0
):
    handle = {"conn_id": conn, "cluster": cluster, "job_id": job_id, "job_name": f"npa-{job_id}", "submitted_at": at}
    return r.LiveTask(dag, "run 1", "train", -1, 2, state, {"slurm_job": handle}, {"sbatch_script": script})


def burst_task(job_id=3, cluster="sky-a", dag="d2"):
    handle = {"conn_id": "skypilot_default", "cluster": cluster, "job_id": job_id, "endpoint": "http://s"}
    return r.LiveTask(dag, "r", "burst", 0, 1, "deferred", {"burst_job": handle}, {})


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (SCRIPT, r.Resources(nodes=2, gpus_per_node=8, partition="gpu")),
        ("#SBATCH -N 3\n#SBATCH -p cpu\necho", r.Resources(nodes=3, gpus_per_node=None, partition="cpu")),
        ("#SBATCH --gpus-per-node=4\n#SBATCH --nodes=1", r.Resources(nodes=1, gpus_per_node=4)),
        ("#SBATCH --gres=gpu:a100:4,nvme:1", r.Resources(gpus_per_node=4)),
        ("Truncated. You can change this behaviour in [core]max_templated_field_length. ...", r.Resources()),
        (None, r.Resources()),
    ],
)
def test_resources_come_from_the_sbatch_lines_before_the_first_command(script, expected):
    assert r.parse_sbatch_resources(script) == expected


def test_a_script_airflow_truncated_still_gives_its_resources():
    """Airflow stores a rendered field over [core] max_templated_field_length cut, behind a prefix: the head of a
    long script keeps its #SBATCH lines, and a directive the cut ran through is not read at all."""
    from airflow.sdk._shared.template_rendering import TRUNCATE_PREFIX, truncate_rendered_value

    assert TRUNCATE_PREFIX == r.AIRFLOW_TRUNCATED_PREFIX
    long_script = SCRIPT + "echo x\n" * 2000
    assert r.parse_sbatch_resources(truncate_rendered_value(long_script, 4096)) == r.parse_sbatch_resources(SCRIPT)
    cut_in_nodes = len(r.AIRFLOW_TRUNCATED_PREFIX) + len("...") + SCRIPT.index("--nodes=2") + len("--nodes=")
    truncated = truncate_rendered_value(SCRIPT.replace("--nodes=2", "--nodes=24"), cut_in_nodes + 1)
    assert "--nodes=2..." in truncated
    assert r.parse_sbatch_resources(truncated) == r.Resources(nodes=None, gpus_per_node=None, partition="gpu")


def test_one_query_per_connection_and_cluster_with_each_job_once():
    tasks = [
        slurm_task("1"),
        slurm_task("2"),
        slurm_task("1"),  # the same job seen twice is asked about once
        slurm_task("3", cluster="c2"),
        slurm_task("4", conn="other"),
        burst_task(),
    ]
    assert r.slurm_queries(tasks) == {
        ("slurm_default", None): ["1", "2"],
        ("slurm_default", "c2"): ["3"],
        ("other", None): ["4"],
    }
    assert r.burst_queries([burst_task(3), burst_task(4), burst_task(5, cluster="sky-b"), burst_task(None)]) == {
        ("skypilot_default", "sky-a"): [3, 4],
        ("skypilot_default", "sky-b"): [5],
    }


def test_a_running_slurm_job_counts_its_allocated_nodes_and_links_to_its_task_and_log():
    status = r.JobStatus("RUNNING", "RUNNING", None, "gpu-[1-2]")
    row = r.slurm_row(slurm_task(), status, {"slurm_default": "main"}, now=1090.0, job_url="https://ood/1")
    assert (row.cluster, row.job, row.state, row.nodes, row.gpus, row.partition) == (
        "main",
        "101",
        "RUNNING",
        2,
        16,
        "gpu",
    )
    assert row.elapsed_s == 90 and row.job_url == "https://ood/1"
    assert row.task_url == "/dags/d1/runs/run%201/tasks/train/details"
    assert row.log_url == "/dags/d1/runs/run%201/tasks/train?try_number=2"


def test_a_pending_job_shows_its_reason_and_the_gpus_it_waits_for():
    row = r.slurm_row(slurm_task(), r.JobStatus("PENDING", "PENDING", "Resources"), {}, now=1000.0)
    assert (row.cluster, row.state, row.reason, row.nodes, row.gpus) == ("slurm_default", "PENDING", "Resources", 2, 16)


def test_a_job_the_query_did_not_answer_is_unknown_not_dropped():
    row = r.slurm_row(slurm_task(cluster="c2"), None, {}, now=0.0)
    assert (row.cluster, row.state, row.reason, row.elapsed_s) == ("c2", "UNKNOWN", None, None)


def test_a_mapped_task_links_to_its_mapped_page():
    task = r.LiveTask("d", "r", "t", 4, 1, "running", {"slurm_job": {"conn_id": "c", "job_id": "9"}})
    assert r.slurm_row(task, None, {}, now=0.0).task_url == "/dags/d/runs/r/tasks/t/mapped/4/details"


def test_a_burst_launch_without_a_job_id_is_pending_on_its_launch():
    row = r.burst_row(burst_task(None), None, now=0.0)
    assert (row.kind, row.cluster, row.job, row.state, row.native_state) == (
        "burst",
        "sky-a",
        "sky-a/-",
        "PENDING",
        "LAUNCHING",
    )
    assert row.reason == f"launching: {r.BURST_WAITING}"
    assert r.burst_status("INIT", "PENDING").reason == r.BURST_WAITING
    assert r.burst_status("RUNNING", "RUNNING").reason is None
    running = r.burst_row(burst_task(3), r.JobStatus("RUNNING", "RUNNING"), now=0.0)
    assert (running.job, running.state) == ("sky-a/3", "RUNNING")


def _rows():
    return [
        r.slurm_row(slurm_task("1"), r.JobStatus("RUNNING", "RUNNING", None, "g1"), {}, now=2000.0),
        r.slurm_row(slurm_task("2", dag="d2"), r.JobStatus("PENDING", "PENDING", "Resources"), {}, now=2000.0),
        r.slurm_row(
            slurm_task("3", cluster="c2", script="#SBATCH -N 1\necho"), r.JobStatus("RUNNING", "RUNNING"), {}, now=0
        ),
    ]


def test_totals_count_gpus_held_by_running_and_wanted_by_pending_jobs_per_cluster():
    assert r.cluster_totals(_rows()) == [
        {"cluster": "c2", "jobs": 1, "running": 1, "pending": 0, "gpus_held": 0, "gpus_pending": 0},
        {"cluster": "slurm_default", "jobs": 2, "running": 1, "pending": 1, "gpus_held": 8, "gpus_pending": 16},
    ]


def test_filters_combine_and_an_empty_filter_matches_everything():
    rows = _rows()
    assert [x.job for x in r.filter_rows(rows, state="pending")] == ["2"]
    assert [x.job for x in r.filter_rows(rows, cluster="slurm_default", dag_id="d1")] == ["1"]
    assert len(r.filter_rows(rows, cluster="", state=None, dag_id="")) == 3
    assert [x.job for x in r.sort_rows(reversed(rows))] == ["3", "1", "2"]
