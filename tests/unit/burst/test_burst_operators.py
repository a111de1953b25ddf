"""Burst operators (burst/operators.py)."""

from __future__ import annotations


def test_probe_operator_runs_the_slurm_sides_all_reduce_script_under_the_launcher():
    from pathlib import Path

    from npa_airflow.burst.launcher import render_launcher
    from npa_airflow.burst.operators import BurstNcclProbeOperator
    from npa_airflow.burst.task import build_task

    op = BurstNcclProbeOperator(task_id="probe", image=None, nodes=2, gpu_per_node="H100:8", collective_timeout=60)
    spec = op.spec()
    assert (Path(spec.workdir) / "nccl_allreduce_probe.py").is_file()
    task = build_task(spec, render_launcher(spec))
    assert task["envs"] == {"NPA_PROBE_COLLECTIVE_TIMEOUT": "60"}
    assert task["run"].rstrip().endswith('--master-port="$MASTER_PORT" \\\n  nccl_allreduce_probe.py')
