"""dev/demo's closing summary: each task, its state, its job and where its output and results are."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "dev" / "demo_summary.py"
spec = importlib.util.spec_from_file_location("demo_summary", SCRIPT)
demo_summary = sys.modules["demo_summary"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(demo_summary)

SLURM = {
    "job_id": "539", "job_name": "npa-slurm-train-train-d944fcb87d-t1", "cluster": None,
    "stdout_path": "/shared/results/slurm-logs/x/main.out", "results_dir": "/shared/results/x",
}  # fmt: skip


def test_each_task_shows_its_state_job_output_and_results():
    rows = [
        demo_summary.TaskRow("preflight", "success", 1, None),
        demo_summary.TaskRow("train", "failed", 2, "/home/logs/attempt=2.log", slurm=SLURM),
        demo_summary.TaskRow("burst", "success", 1, None, burst={"cluster": "npa-b-t1", "job_id": 1}),
    ]
    text = demo_summary.render("slurm_train", "manual__1", "failed", rows)
    assert "== slurm_train: run manual__1 FAILED ==" in text
    assert "train      failed (try 2)" in text
    assert "Slurm job 539 (npa-slurm-train-train-d944fcb87d-t1): `sacct -j 539`" in text
    assert "output   /shared/results/slurm-logs/x/main.out" in text and "results  /shared/results/x" in text
    assert "task log /home/logs/attempt=2.log" in text
    assert "SkyPilot job 1 on cluster npa-b-t1" in text
    assert 'eval "$(dev/cluster env)"' in text


def test_a_job_on_another_cluster_names_it():
    row = demo_summary.TaskRow("train", "running", 1, None, slurm={**SLURM, "cluster": "b"})
    assert "Slurm job 539 (npa-slurm-train-train-d944fcb87d-t1) on cluster b" in demo_summary.describe_job(row)[0]


def test_without_accounting_the_summary_points_at_slurmctlds_record():
    row = demo_summary.TaskRow(
        "train", "success", 1, None, slurm={"job_id": "7", "job_name": "n", "stdout_path": "/o", "results_dir": "/r"}
    )
    assert "`sacct -j 7`" in demo_summary.describe_job(row)[0]
    assert "`scontrol show job 7`" in demo_summary.describe_job(row, accounting=False)[0]
