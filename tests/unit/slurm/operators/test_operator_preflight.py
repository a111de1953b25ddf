"""SlurmPreflightOperator: the request it builds from the connection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import SlurmPreflightOperator
from tests.harness.slurm_operator_doubles import CFG_WITH_EXTRAS as CFG


def test_preflight_request_defaults_from_the_connection() -> None:
    op = SlurmPreflightOperator(task_id="p", dataset_paths="lustre:///lustre/data", time_hours=4)
    req = op.build_request(CFG)
    assert req.writable_dirs == (("results_root", "/lustre/results"), ("sqsh_cache_dir", "/lustre/sqsh"))
    assert req.partitions == ("gpu", "cpu_long")
    assert req.dataset_paths == ("lustre:///lustre/data",)
    assert req.time_minutes == 240
    assert req.check_pyxis and req.check_enroot
    bare = SlurmPreflightOperator(task_id="p", containers=False).build_request(CFG)
    assert bare.writable_dirs == (("results_root", "/lustre/results"),)
    assert bare.partitions == ("gpu",)
    assert not bare.check_pyxis and not bare.check_enroot
    with pytest.raises(NpaValidationError, match="relative"):
        SlurmPreflightOperator(task_id="p", dataset_paths=["data"]).build_request(CFG)


def test_preflight_asks_again_only_while_the_controller_is_silent(monkeypatch) -> None:
    from npa_airflow.slurm.operators import preflight as preflight_operator

    pauses: list[float] = []
    monkeypatch.setattr(preflight_operator, "pause", pauses.append)
    silent = SimpleNamespace(only_transient=True, failures=[SimpleNamespace(problem="slurmctld did not answer")])
    answered = SimpleNamespace(only_transient=False, failures=[])
    reports = [silent, silent, answered]
    monkeypatch.setattr("npa_airflow.slurm.submit.preflight.build_preflight_command", lambda request, cluster: "true")
    monkeypatch.setattr("npa_airflow.slurm.submit.preflight.parse_preflight", lambda text, request: reports.pop(0))
    ran = SimpleNamespace(returncode=0, text="", host="login1", error_text="")
    hook = SimpleNamespace(run=lambda command, check, timeout: ran)
    op = SlurmPreflightOperator(task_id="p")

    assert op._run_checks(hook, None, None) == ("login1", answered)
    assert len(pauses) == 2 and 5.0 <= pauses[0] <= 6.0 and 10.0 <= pauses[1] <= 12.0

    reports[:] = [silent] * 5
    pauses.clear()
    assert op._run_checks(hook, None, None) == ("login1", silent)  # PREFLIGHT_ATTEMPTS asks, then the report
    assert len(reports) == 5 - preflight_operator.PREFLIGHT_ATTEMPTS and len(pauses) == 2
