"""Guard on the burst example task YAMLs: the set is pinned, and each is one task with placeholders only.

Adding a file under dags_examples/burst/ fails this test until PINNED is updated on purpose. First ask
why the new file is not a workflow: burst runs one coupled multi-node job, never a pipeline.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npa_airflow.burst.task import load_task_yaml, substitute_vars

EXAMPLES = Path(__file__).resolve().parents[3] / "dags_examples" / "burst"
PINNED = frozenset({"task.yaml"})


def test_the_example_set_is_pinned():
    present = {
        str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    assert present == PINNED, (
        f"dags_examples/burst/ holds {sorted(present)}, the pinned set is {sorted(PINNED)}. A new example must "
        "answer 'why is this not a workflow?' and then be added to PINNED in tests/unit/burst/test_burst_examples.py"
    )


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_example_is_one_task_that_needs_its_vars(name):
    text = (EXAMPLES / name).read_text()
    task = load_task_yaml(text, name)
    placeholders = {m for m in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text) if not m.startswith("SKYPILOT_")}
    assert placeholders, f"{name} must keep ${{VAR}} placeholders instead of concrete values"
    with pytest.raises(Exception, match="unresolved placeholder"):
        substitute_vars(task, {})
    filled = substitute_vars(task, dict.fromkeys(placeholders, "x"))
    assert "${NPA_" not in str(filled)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_examples_bake_in_no_registry_bucket_or_credential(name):
    text = (EXAMPLES / name).read_text()
    assert not re.search(r"(nvcr\.io|ghcr\.io|docker\.io|amazonaws\.com|s3://|gs://|npa-local)", text)
    assert "SKYPILOT_DOCKER_" not in text
