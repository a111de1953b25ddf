"""The distribution as users get it: a built wheel in a fresh virtualenv, and Airflow's provider discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_ships_templates_and_loads_them_from_a_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("npa_airflow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "npa_airflow/templates/slurm/singlenode.sbatch.j2" in names
    assert "npa_airflow/compute/page.html" in names  # the Compute page (plugin)
    assert not any(name.startswith("tests/") for name in names)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # Only what template loading needs: the provider's heavy runtime deps are not under test here.
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel), "jinja2", "markupsafe"], check=True)
    probe = (
        "import npa_airflow.common.templates as t; d = t.templates_dir(); "
        "src = t.template_env().get_template('slurm/singlenode.sbatch.j2').filename; print(d); print(src)"
    )
    out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    templates_dir, source = out.split()
    assert templates_dir.startswith(str(env_dir)) and templates_dir.endswith("npa_airflow/templates")
    assert source.startswith(templates_dir)


def test_airflow_lists_the_provider_with_its_connection_types(tmp_path):
    airflow = Path(sys.executable).parent / "airflow"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    listed = subprocess.run(
        [airflow, "providers", "list", "-o", "json"], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert "npa-airflow" in {p["package_name"] for p in json.loads(listed)}
    conns = subprocess.run(
        [airflow, "providers", "hooks", "-o", "json"], env=env, check=True, capture_output=True, text=True
    ).stdout
    types = {row["connection_type"]: row for row in json.loads(conns)}
    assert types["slurm"]["class"] == "npa_airflow.slurm.hook.SlurmHook"
    assert types["skypilot"]["class"] == "npa_airflow.burst.hook.SkyPilotHook"
