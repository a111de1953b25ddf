"""SlurmSqshConvertOperator: target paths, and the failure it reports for a conversion held by a QOS memory limit.

The QOS case uses a recording stand-in for the hook: the local cluster does not enforce QOS limits
(AccountingStorageEnforce is off), so a job pending on QOSGrpMemLimit cannot be produced there. The trigger's
side of the hold is tested in tests/unit/slurm/test_convert_trigger.py.
"""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.operators import SlurmSqshConvertOperator
from npa_airflow.slurm.transport.cancels import CancelRequest
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from tests.harness.slurm_operator_doubles import CFG_WITH_EXTRAS as CFG
from tests.harness.slurm_operator_doubles import context, sqsh_convert_handle


class RecordingHook:
    """Stands in for SlurmHook where the cluster cannot produce the state under test."""

    def __init__(self) -> None:
        self.config = CFG
        self.cancelled: list[str] = []

    def cancel_one(self, request: CancelRequest) -> str:
        self.cancelled.append(request.job_id)
        return "cancelled"


def test_blocked_conversion_is_cancelled_with_the_seeds_advice(monkeypatch) -> None:
    op = SlurmSqshConvertOperator(task_id="convert", image="nvcr.io/nvidia/pytorch:24.01-py3")
    hook = RecordingHook()
    monkeypatch.setattr(op, "get_hook", lambda: hook)
    event = {
        "status": "held_by_qos",
        "job_id": "42",
        "handle": sqsh_convert_handle().to_dict(),
        "message": "Slurm job 42 is PENDING on QOSGrpMemLimit",
        "blocked_by_qos": True,
        "reason": "QOSGrpMemLimit",
    }
    with pytest.raises(AirflowFailException) as err:
        op.execute_complete(context(), event)
    assert hook.cancelled == ["42"]
    message = str(err.value)
    assert "PENDING on QOSGrpMemLimit" in message
    assert "-p cpu_long -c4 --mem=7200M" in message
    assert "Do not wait for the QOS" in message


def test_convert_target_paths() -> None:
    op = SlurmSqshConvertOperator(task_id="c", image="nvcr.io/nvidia/pytorch:24.01-py3")
    assert op.target_path(CFG) == "/lustre/sqsh/nvcr.io+nvidia+pytorch+24.01-py3.sqsh"
    op = SlurmSqshConvertOperator(task_id="c", image="ubuntu", sqsh_cache_dir="/other")
    assert op.target_path(CFG) == "/other/docker.io+library+ubuntu+latest.sqsh"
    op = SlurmSqshConvertOperator(task_id="c", image="ubuntu:22.04", target="/x/u.sqsh")
    assert op.target_path(CFG) == "/x/u.sqsh"
    op = SlurmSqshConvertOperator(task_id="c", image="/ready/pt.sqsh")
    assert op.target_path(CFG) == "/ready/pt.sqsh"
    no_cache = SlurmConnectionConfig(conn_id="c", hosts=(("h", 22),), user="u", insecure_skip_host_key_check=True)
    with pytest.raises(NpaValidationError, match="sqsh_cache_dir"):
        SlurmSqshConvertOperator(task_id="c", image="ubuntu:22.04").target_path(no_cache)
