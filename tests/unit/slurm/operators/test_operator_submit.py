"""SlurmSubmitOperator: parse-time and render-time validation, the rendered script."""

from __future__ import annotations

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import SlurmSubmitOperator
from tests.harness.slurm_operator_doubles import (
    HookDouble,
    context,
    install_unit_connection,
    make_op,
    name,
)


@pytest.fixture(autouse=True)
def slurm_conn(monkeypatch):
    install_unit_connection(monkeypatch)


def test_bad_arguments_fail_at_parse_time():
    with pytest.raises(NpaValidationError, match="on_previous_try='resubmit'"):
        SlurmSubmitOperator(task_id="t", command="x", on_previous_try="resubmit")
    with pytest.raises(NpaValidationError, match="nodes=0"):
        SlurmSubmitOperator(task_id="t", command="x", nodes=0)
    with pytest.raises(NpaValidationError, match="gpus_per_node=9"):
        SlurmSubmitOperator(task_id="t", command="x", gpus_per_node=9)
    with pytest.raises(NpaValidationError, match="never the secret itself"):
        SlurmSubmitOperator(task_id="t", command="x", secret_env={"HF_TOKEN": "hf_abcdefabcdefabcdef"})
    with pytest.raises(NpaValidationError, match="poll_interval"):
        SlurmSubmitOperator(task_id="t", command="x", poll_interval=0)


def test_rendered_template_is_the_exact_script_with_the_try_job_name():
    op = make_op(HookDouble(), nodes=2, command="echo rank $NODE_RANK of $WORLD_SIZE in {results_dir}")
    op.render_template_fields(context(try_number=3))
    script = op.sbatch_script
    assert f"#SBATCH --job-name={name(3)}" in script
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=cpu" in script
    assert "export WORLD_SIZE=2" in script and 'NODE_RANK="${SLURM_NODEID}"' in script
    assert f"/shared/results/{name(3)}" in script  # {results_dir} bound to this try's own directory
    assert "{results_dir}" not in script


def test_local_inputs_are_rejected_before_anything_runs():
    op = make_op(HookDouble(), inputs=["file:///home/me/data"])
    with pytest.raises(NpaValidationError, match="compute nodes cannot read"):
        op.render_template_fields(context())
    op = make_op(HookDouble(), inputs=["data/train"])
    with pytest.raises(NpaValidationError, match="relative"):
        op.render_template_fields(context())
