"""The operators package: cheap to import from a DAG file, defaults equal to the builders'."""

from __future__ import annotations


def test_operator_defaults_match_the_builders() -> None:
    from npa_airflow.slurm.operators import convert as convert_operator
    from npa_airflow.slurm.operators import probe as probe_operator
    from npa_airflow.slurm.submit import enroot, probe

    assert convert_operator.DEFAULT_CONVERT_CPUS == enroot.DEFAULT_CONVERT_CPUS == 4
    assert convert_operator.DEFAULT_CONVERT_MEM == enroot.DEFAULT_CONVERT_MEM == "7200M"
    assert convert_operator.MIN_CONVERT_MINUTES == enroot.MIN_CONVERT_MINUTES == 120
    assert probe_operator.DEFAULT_SOCKET_IFNAME == probe.DEFAULT_SOCKET_IFNAME
    assert probe_operator.DEFAULT_TIMEOUT_SECONDS == probe.DEFAULT_TIMEOUT_SECONDS == 120


def test_importing_the_operators_pulls_in_no_ssh_or_builders() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import npa_airflow.slurm.operators; "
        "print(sorted(m for m in ('asyncssh', 'paramiko', 'npa_airflow.slurm.hook', 'npa_airflow.slurm.submit.enroot', "
        "'npa_airflow.slurm.submit.probe', 'npa_airflow.slurm.submit.images') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
