"""The XCom keys: their stored values never change, and each has one name, in common/xcom_keys.py."""

from __future__ import annotations

import ast
from pathlib import Path

import npa_airflow
from npa_airflow.common import xcom_keys

STORED = {
    "SLURM_JOB": "slurm_job",
    "SLURM_TRY": "slurm_try",
    "BURST_JOB": "burst_job",
    "TRIGGER_CLAIM": "npa_trigger_claim",
    "BURST_LOG_LINES": "npa_burst_log_lines",
    "USAGE": "npa_usage",
}


def test_the_values_stay_what_stored_xcoms_hold():
    keys = {name: value for name, value in vars(xcom_keys).items() if name.isupper()}
    assert keys == STORED


def _second_names(path: Path) -> list[str]:
    """Module-level names (or `... as NAME` imports) that stand for an XCom key under another name."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "npa_airflow.common.xcom_keys":
            found += [f"{a.name} as {a.asname or a.name}" for a in node.names]
        if isinstance(node, ast.Assign):
            value = node.value
            aliased = isinstance(value, ast.Attribute) and ast.unparse(value).startswith("xcom_keys.")
            literal = isinstance(value, ast.Constant) and value.value in STORED.values()
            if aliased or literal:
                found.append(ast.unparse(node))
    return found


def test_no_module_gives_a_key_a_second_name():
    root = Path(npa_airflow.__file__).parent
    found = {
        str(path.relative_to(root)): names
        for path in sorted(root.rglob("*.py"))
        if path.name != "xcom_keys.py" and (names := _second_names(path))
    }
    assert found == {}, "use npa_airflow.common.xcom_keys.<KEY> itself"
