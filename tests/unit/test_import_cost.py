"""DAG files import the provider's operators at parse time: they must not drag in transport or cloud libraries.

A module-set check in a fresh interpreter (no timing): after `import airflow.sdk`, importing the DAG-facing
modules may not add asyncssh, paramiko, SkyPilot, an HTTP client that airflow.sdk does not already load, the
provider's own I/O modules (which import those), or the Burst modules only a running task needs. Timings live
in `benchmarks/` (`--only imports`).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

DAG_FACING = (
    "npa_airflow",
    "npa_airflow.slurm.operators",
    "npa_airflow.slurm.sensors",
    "npa_airflow.burst.operators",
    "npa_airflow.burst.sensors",
)
HEAVY_TOP_LEVEL = {"asyncssh", "paramiko", "sky", "sshtunnel", "httpx", "requests", "aiohttp", "kubernetes"}
IO_MODULES = {"npa_airflow.slurm.hook", "npa_airflow.burst.client", "npa_airflow.burst.hook"}
# Needed only once a task runs (the SkyPilot task builder, the Burst job handle: 5-6 ms of module bodies at parse;
# the Slurm command builders and parsers, which the Slurm handle once pulled in for its patterns: 13 ms).
RUN_TIME_MODULES = {"npa_airflow.burst.task", "npa_airflow.burst.handle", "npa_airflow.slurm.commands"}

_PROBE = """
import json, sys
import airflow.sdk
base = set(sys.modules)
added = {}
for name in sys.argv[1:]:
    before = set(sys.modules)
    __import__(name)
    added[name] = sorted(set(sys.modules) - before)
print(json.dumps({"base": sorted(base), "added": added}))
"""


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="module")
def imports() -> dict:
    modules = [m for m in DAG_FACING if _present(m)]
    out = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", DAG_FACING)
def test_dag_facing_module_imports_no_transport_or_cloud_library(imports, module):
    if module not in imports["added"]:
        pytest.skip(f"{module} does not exist in this tree yet")
    base_top = {m.split(".")[0] for m in imports["base"]}
    added = imports["added"][module]
    heavy = sorted({m for m in added if m.split(".")[0] in HEAVY_TOP_LEVEL - base_top})
    io = sorted(set(added) & IO_MODULES)
    assert not heavy, (
        f"importing {module} (after airflow.sdk) loads {heavy}: import them inside the function that needs them "
        f"or under TYPE_CHECKING; `python -X importtime -c 'import {module}'` shows who imports them"
    )
    assert not io, f"importing {module} loads the provider's I/O module(s) {io} at DAG parse time: import lazily"
    run_time = sorted(set(added) & RUN_TIME_MODULES)
    assert not run_time, f"importing {module} loads {run_time}, which only a running task needs: import lazily"


def test_the_probe_sees_a_heavy_import(tmp_path):
    """The check above can fail: the same probe reports asyncssh when a module imports the hook."""
    (tmp_path / "dag_with_hook.py").write_text("import npa_airflow.slurm.hook\n")
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + _PROBE, "dag_with_hook"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    added = json.loads(out.stdout.strip().splitlines()[-1])["added"]["dag_with_hook"]
    assert "asyncssh" in added and "npa_airflow.slurm.hook" in added
