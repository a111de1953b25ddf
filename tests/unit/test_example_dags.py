"""Guard on dags_examples/: the set of example DAG files is pinned, and every one imports cleanly.

A new example must be added here on purpose (first ask: is this a new capability, or a variant of an
example that already exists?). The import check runs the same command an operator would run,
`airflow dags list-import-errors --local`, in a throwaway AIRFLOW_HOME with no connections defined, so a
DAG file that does I/O or needs a connection at parse time fails here too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "dags_examples"
AIRFLOW = Path(sys.executable).with_name("airflow")

PINNED_EXAMPLES = frozenset(
    {
        "burst_submit_yaml.py",
        "burst_torchrun.py",
        "slurm_checkpoint.py",
        "slurm_train.py",
        "slurm_training.py",
    }
)


def _example_files() -> set[str]:
    return {
        str(p.relative_to(EXAMPLES))
        for p in EXAMPLES.rglob("*.py")
        if "__pycache__" not in p.parts and p.name != "__init__.py"
    }


@pytest.fixture(scope="module")
def airflow_cli(tmp_path_factory):
    """Run the airflow CLI in a throwaway, migrated AIRFLOW_HOME; return the JSON it prints."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(EXAMPLES),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
    )

    def run(*args: str) -> list[dict]:
        r = subprocess.run([str(AIRFLOW), *args], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"airflow {' '.join(args)} exited {r.returncode}:\n{r.stderr}\n{r.stdout}"
        json_lines = [line for line in r.stdout.splitlines() if line.startswith("[")]
        return json.loads(json_lines[-1]) if json_lines else []

    run("db", "migrate")
    return run


def test_example_dag_files_are_the_pinned_set():
    found = _example_files()
    added, missing = sorted(found - PINNED_EXAMPLES), sorted(PINNED_EXAMPLES - found)
    assert not added and not missing, (
        f"dags_examples/ changed: added {added}, missing {missing}. The example set is pinned on purpose: "
        f"update PINNED_EXAMPLES in {Path(__file__).relative_to(REPO)} only if the change is intended."
    )


def test_no_import_errors_in_examples(airflow_cli):
    errors = airflow_cli("dags", "list-import-errors", "--local", "--output", "json")
    assert errors == [], "import errors in dags_examples/:\n" + "\n".join(
        f"{e['filepath']}:\n{e['error']}" for e in errors
    )


def test_every_example_file_defines_a_dag(airflow_cli):
    """An example that imports but defines no DAG would pass the import check and show nothing in the UI."""
    dags = airflow_cli("dags", "list", "--local", "--output", "json", "--columns", "dag_id,fileloc")
    files_with_dags = {str(Path(d["fileloc"]).resolve().relative_to(EXAMPLES.resolve())) for d in dags}
    without = sorted(_example_files() - files_with_dags)
    assert not without, f"these example files define no DAG: {without}"


def test_examples_use_the_current_argument_names():
    """The examples teach the one vocabulary: no argument under an old name (npa_airflow.common.renamed)."""
    import ast

    from npa_airflow.common.renamed import BURST_RENAMED

    old = []
    for name in sorted(_example_files()):
        tree = ast.parse((EXAMPLES / name).read_text(), name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                old += [f"{name}:{node.lineno} {kw.arg}=" for kw in node.keywords if kw.arg in BURST_RENAMED]
    assert not old, f"old argument names in dags_examples/ (use {dict(BURST_RENAMED)}): {old}"
