"""SlurmSubmitOperator: parse-time and render-time validation, the rendered script."""

from __future__ import annotations

import re
import subprocess

import jinja2
import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import SlurmSubmitOperator
from npa_airflow.slurm.submit.scripts import render_sbatch
from npa_airflow.slurm.submit.spec import SbatchSpec
from tests.harness.slurm_operator_doubles import (
    UNIT_CONFIG,
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


def test_a_script_longer_than_airflow_shows_says_so_in_the_task_log(capsys):
    from airflow.sdk.configuration import conf

    limit = conf.getint("core", "max_templated_field_length")
    make_op(HookDouble(), command="true").render_template_fields(context())
    assert "max_templated_field_length" not in capsys.readouterr().out
    long = make_op(HookDouble(), command="echo " + "x" * limit)
    long.render_template_fields(context())
    logged = capsys.readouterr().out  # the task logger writes through structlog
    assert f"has {len(long.sbatch_script)} characters" in logged and f"its first {limit} " in logged


def test_local_inputs_are_rejected_before_anything_runs():
    op = make_op(HookDouble(), inputs=["file:///home/me/data"])
    with pytest.raises(NpaValidationError, match="compute nodes cannot read"):
        op.render_template_fields(context())
    op = make_op(HookDouble(), inputs=["data/train"])
    with pytest.raises(NpaValidationError, match="relative"):
        op.render_template_fields(context())


def _dag_op(**kwargs):
    """The operator in a DAG, rendered as the task runner does: with the DAG's own Jinja environment."""
    from airflow.sdk import DAG

    with DAG("train_dag", schedule=None) as dag:
        op = make_op(HookDouble(), **kwargs)
    return op, dag


def test_environment_values_keep_their_final_newlines_byte_for_byte():
    values = {"A": "a\n", "B": "b\n\n", "C": "{{ 'c' }}\n", "D": "\n"}
    op, dag = _dag_op(environment=values)
    op.render_template_fields(context(), jinja_env=dag.get_template_env())
    script = op.sbatch_script
    exports = script[script.index("export A=") : script.index("export NPA_RESULTS_DIR=")]
    done = subprocess.run(
        ["bash", "-c", exports + 'printf "%s\\0" "$A" "$B" "$C" "$D"'], capture_output=True, check=True
    )
    assert done.stdout.split(b"\0")[:-1] == [b"a\n", b"b\n\n", b"c\n", b"\n"]


def test_the_advice_for_a_literal_brace_in_a_command_works_as_given():
    op, dag = _dag_op(command="python -c 'print(\"{epoch}\".format(epoch=3))'")
    with pytest.raises(NpaValidationError, match="unknown placeholder") as raised:
        op.render_template_fields(context(), jinja_env=dag.get_template_env())
    stale, stale_dag = _dag_op(command="echo {{epoch}}")  # the escape alone is a Jinja expression in a field
    with pytest.raises(jinja2.UndefinedError, match="epoch"):
        stale.render_template_fields(context(), jinja_env=stale_dag.get_template_env())
    advice = re.search(r"or (\{% raw %\}.*?\{% endraw %\}) in an operator", str(raised.value)).group(1)
    op, dag = _dag_op(command="python -c 'print(\"" + advice + "\".format(epoch=3))'")
    op.render_template_fields(context(), jinja_env=dag.get_template_env())
    assert "python -c 'print(\"{epoch}\".format(epoch=3))'\n" in op.sbatch_script
    spec_advice = re.search(r"write (\S+) in an SbatchSpec", str(raised.value)).group(1)
    spec = SbatchSpec(
        job_name="npa-x-t1", command=f"echo {spec_advice}", log_dir="/l", results_dir="/r", gpus_per_node=0
    )
    assert "echo {epoch}\n" in render_sbatch(spec)


def test_secret_values_reach_the_sidecar_byte_for_byte():
    from npa_airflow.slurm.operators.job import JobEnvironment

    op = make_op(HookDouble(), secret_env={"NPA_SECRET": "conn:x"})
    secrets = {"NPA_SECRET": "s3cr3t 'x'\n\n"}
    job = op.prepare_job(name(1), (), JobEnvironment(config=UNIT_CONFIG, secrets=secrets), {})
    [sidecar] = job.files
    done = subprocess.run(
        ["bash", "-c", sidecar.data.decode() + 'printf %s "$NPA_SECRET"'], capture_output=True, check=True
    )
    assert done.stdout == secrets["NPA_SECRET"].encode()


def test_a_container_step_sees_its_results_dir_inputs_and_config_at_the_same_path():
    from npa_airflow.slurm.operators.job import JobEnvironment

    op = make_op(
        HookDouble(),
        image="/shared/sqsh/pt.sqsh",
        inputs=["lustre:///shared/data/set"],
        config_path="/shared/configs/run.yaml",
        container_mounts=["/shared/code:/code:ro"],
        secret_env={"HF_TOKEN": "conn:hf"},
        environment={"RUN_NOTE": "x"},
    )
    job = op.prepare_job(name(1), (), JobEnvironment(config=UNIT_CONFIG, secrets={"HF_TOKEN": "t0k3n"}), {})
    results = f"/shared/results/{name(1)}"
    assert job.required_paths == ("/shared/data/set", "/shared/configs/run.yaml")  # checked before submission
    assert (
        '  --container-mounts=/shared/code:/code:ro,"${NPA_RESULTS_DIR}",/shared/data/set,/shared/configs/run.yaml \\\n'
        '  --container-workdir="${NPA_RESULTS_DIR}" \\\n'
        "  --container-env=NPA_RESULTS_DIR,NPA_CHILD_EXIT_CODE_FILE,NPA_CHILD_TIMEOUT_SECONDS,RUN_NOTE,HF_TOKEN \\\n"
    ) in job.script
    assert f"export NPA_RESULTS_DIR={results}\n" in job.script

    # A config the job writes into its own results dir is neither checked beforehand nor mounted twice.
    inside = make_op(HookDouble(), image="/i.sqsh", config_path=f"{results}/cfg.yaml", container_workdir="/ws")
    job = inside.prepare_job(name(1), (), JobEnvironment(config=UNIT_CONFIG), {})
    assert job.required_paths == () and "  --container-workdir=/ws \\\n" in job.script
