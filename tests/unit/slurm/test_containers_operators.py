"""Operator logic of preflight, conversion and probe that needs no cluster.

The QOS cases feed poll results to the real trigger loop and use a recording stand-in for the hook: the local
cluster does not enforce QOS limits (AccountingStorageEnforce is off), so a job pending on QOSGrpMemLimit
cannot be produced there.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.commands import SlurmJobInfo
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.containers import (
    SlurmEnrootCredentialsOperator,
    SlurmNcclProbeOperator,
    SlurmPreflightOperator,
    SlurmSqshConvertOperator,
)
from npa_airflow.slurm.convert_trigger import SqshConvertTrigger
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.poller import PollUpdate, Registration

CFG = SlurmConnectionConfig(
    conn_id="slurm_default",
    hosts=(("login1", 22),),
    user="npa",
    insecure_skip_host_key_check=True,
    partition="gpu",
    cpu_partition="cpu_long",
    results_root="/lustre/results",
    sqsh_cache_dir="/lustre/sqsh",
)


class RecordingHook:
    """Stands in for SlurmHook where the cluster cannot produce the state under test."""

    def __init__(self) -> None:
        self.config = CFG
        self.cancelled: list[str] = []

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def _info(state: JobState, native: str, reason: str | None) -> SlurmJobInfo:
    return SlurmJobInfo("42", native, state, None, None, "npa-x-0123456789-t1", None, reason, "squeue")


def _handle() -> SlurmJobHandle:
    return SlurmJobHandle(
        conn_id="slurm_default",
        cluster=None,
        job_id="42",
        job_name="npa-x-0123456789-t1",
        login_host="login1:22",
        results_dir="/lustre/sqsh",
        stdout_path="/lustre/results/slurm-logs/x.out",
        stderr_path="/lustre/results/slurm-logs/x.err",
        try_number=1,
        retry_of=None,
        submitted_at=1.0,
    )


def _trigger() -> SqshConvertTrigger:
    return SqshConvertTrigger(handle=_handle().to_dict(), conn_id="slurm_default", poll_interval=2.0)


async def _first_event(trigger: SqshConvertTrigger, updates: list[PollUpdate], monkeypatch) -> dict:
    """Run the real trigger loop on a registration fed with these poll results."""
    reg = Registration(job_id="42", cursors=[], offsets_file=None, interval=2.0, submitted_at=1.0)
    for update in updates:
        reg.queue.put_nowait(update)
    poller = SimpleNamespace(register=lambda *a, **k: reg, unregister=lambda r: None)
    monkeypatch.setattr("npa_airflow.slurm.triggers.get_poller", lambda conn_id: poller)
    gen = trigger.run()
    try:
        event = await anext(gen)
    finally:
        await gen.aclose()
    return event.payload


async def test_convert_trigger_ends_the_wait_on_a_qos_memory_block(monkeypatch) -> None:
    updates = [
        PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "Priority")),
        PollUpdate(cycle=2, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "QOSGrpMemLimit")),
    ]
    payload = await _first_event(_trigger(), updates, monkeypatch)
    assert payload["blocked_by_qos"] is True
    assert payload["reason"] == "QOSGrpMemLimit"
    assert payload["message"] == "Slurm job 42 is PENDING on QOSGrpMemLimit"
    _, kwargs = _trigger().serialize()
    assert _trigger().serialize()[0] == "npa_airflow.slurm.convert_trigger.SqshConvertTrigger"
    assert SqshConvertTrigger(**kwargs).serialize() == _trigger().serialize()


async def test_convert_trigger_waits_through_other_pending_reasons(monkeypatch) -> None:
    done = SlurmJobInfo("42", "COMPLETED", JobState.COMPLETE, 0, 0, "npa-x-0123456789-t1", "c1", None, "sacct")
    updates = [
        PollUpdate(cycle=1, state=JobState.PENDING, info=_info(JobState.PENDING, "PENDING", "Resources")),
        PollUpdate(cycle=2, state=JobState.RUNNING, info=_info(JobState.RUNNING, "RUNNING", None)),
        PollUpdate(cycle=3, state=JobState.COMPLETE, info=done),
    ]
    payload = await _first_event(_trigger(), updates, monkeypatch)
    assert payload["status"] == "success"
    assert "blocked_by_qos" not in payload


def test_blocked_conversion_is_cancelled_with_the_seeds_advice(monkeypatch) -> None:
    op = SlurmSqshConvertOperator(task_id="convert", image="nvcr.io/nvidia/pytorch:24.01-py3")
    hook = RecordingHook()
    monkeypatch.setattr(op, "get_hook", lambda: hook)
    event = {
        "status": "deadline",
        "job_id": "42",
        "handle": _handle().to_dict(),
        "message": "Slurm job 42 is PENDING on QOSGrpMemLimit",
        "blocked_by_qos": True,
        "reason": "QOSGrpMemLimit",
    }
    with pytest.raises(AirflowFailException) as err:
        op.execute_complete({}, event)
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


def test_probe_job_names_carry_the_knob_index() -> None:
    op = SlurmNcclProbeOperator(task_id="probe")
    ti = SimpleNamespace(dag_id="d", task_id="probe", run_id="r1", map_index=-1, try_number=2)
    op._knob_index = 1
    name = op.job_name_for_context({"ti": ti})
    assert name.endswith("-k1-t2") and name.startswith("npa-d-probe-")


def test_probe_gate_returns_no_env_without_touching_the_cluster() -> None:
    op = SlurmNcclProbeOperator(task_id="probe", nodes=1, gpus_per_node=1)
    assert op.execute({}) == {}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"nodes": 0}, "nodes=0"),
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"knob_sets": []}, "non-empty list"),
        ({"knob_sets": [{"MASTER_PORT": "1"}]}, "set by the probe itself"),
    ],
)
def test_probe_rejects_bad_arguments_at_parse_time(kwargs: dict, fragment: str) -> None:
    with pytest.raises(NpaValidationError, match=fragment):
        SlurmNcclProbeOperator(task_id="probe", **kwargs)


def test_credentials_operator_rejects_a_bad_connection_id() -> None:
    with pytest.raises(NpaValidationError, match="registry_conn_id"):
        SlurmEnrootCredentialsOperator(task_id="c", registry_conn_id="bad id")


def test_operator_defaults_match_the_builders() -> None:
    from npa_airflow.slurm import containers, enroot, probe

    assert containers.DEFAULT_CONVERT_CPUS == enroot.DEFAULT_CONVERT_CPUS == 4
    assert containers.DEFAULT_CONVERT_MEM == enroot.DEFAULT_CONVERT_MEM == "7200M"
    assert containers.MIN_CONVERT_MINUTES == enroot.MIN_CONVERT_MINUTES == 120
    assert containers.DEFAULT_SOCKET_IFNAME == probe.DEFAULT_SOCKET_IFNAME
    assert containers.DEFAULT_TIMEOUT_SECONDS == probe.DEFAULT_TIMEOUT_SECONDS == 120


def test_importing_the_operators_pulls_in_no_ssh_or_builders() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import npa_airflow.slurm.containers; "
        "print(sorted(m for m in ('asyncssh', 'paramiko', 'npa_airflow.slurm.hook', 'npa_airflow.slurm.enroot', "
        "'npa_airflow.slurm.probe', 'npa_airflow.slurm.images') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
