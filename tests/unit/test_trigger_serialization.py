"""Every trigger of the package survives Airflow's real trigger table: row written, read back, rebuilt.

The triggerer stores ``trigger.serialize()`` as a ``airflow.models.trigger.Trigger`` row (kwargs encrypted with
the Fernet key) and later rebuilds the trigger from the row's classpath and kwargs. Trigger rows outlive
deployments, so a classpath or a kwarg that does not survive this is an outage after an upgrade.

Trigger classes are found by scanning the package, so a new trigger is covered as soon as it exists (it needs
sample kwargs in ``SAMPLE_KWARGS``: the test says so). The rows go through a throwaway, migrated SQLite
metadata DB in a subprocess (its own AIRFLOW_HOME and Fernet key); no Slurm cluster is needed.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.triggers.base import BaseTrigger

import npa_airflow

AIRFLOW = Path(sys.executable).with_name("airflow")

_SLURM_HANDLE = {
    "conn_id": "slurm_test",
    "cluster": None,
    "job_id": "42",
    "job_name": "npa-dag-task-abc1234567-t1",
    "login_host": "127.0.0.1:2222",
    "results_dir": "/shared/results/run-1",
    "stdout_path": "/shared/results/run-1/slurm-42.out",
    "stderr_path": "/shared/results/run-1/slurm-42.err",
    "try_number": 2,
    "retry_of": "41",
    "submitted_at": 1796217346.5,
}
_SLURM_KWARGS = {
    "handle": _SLURM_HANDLE,
    "conn_id": "slurm_test",
    "poll_interval": 7.0,
    "deadline": 1_900_000_000.5,
    "require_marker": "status.json",
    "stream_logs": False,
    "cancel_on_kill": False,
}
_BURST_HANDLE = {
    "conn_id": "skypilot_default",
    "endpoint": "http://127.0.0.1:46580",
    "cluster": "npa-demo-0123456789-t1",
    "name": "demo",
    "request_id": "63e57704-ba0f-4b9a-a7d1-74dd0df7ba6d",
    "submitted_at": 1796217346.5,
    "job_id": 3,
}

# Constructor kwargs of one instance of each trigger class, by classpath.
SAMPLE_KWARGS: dict[str, dict] = {
    "npa_airflow.slurm.triggers.SlurmJobTrigger": _SLURM_KWARGS,
    "npa_airflow.slurm.convert_trigger.SqshConvertTrigger": {**_SLURM_KWARGS, "require_marker": None},
    "npa_airflow.burst.triggers.BurstJobTrigger": {
        "handle": _BURST_HANDLE,
        "poll_interval": 5.0,
        "deadline": 1_900_000_000.5,
        "stream_logs": True,
        "cancel_on_kill": False,
        "nodes": 2,
    },
    # Its row holds nothing: it reads the task instance (the scheduler writes StartTriggerArgs.trigger_kwargs).
    "npa_airflow.slurm.start_trigger.SlurmStartTrigger": {},
}

# Rows written by earlier versions, with kwargs those versions serialised; each must still rebuild.
LEGACY_ROWS: dict[str, tuple[str, dict]] = {
    "slurm-with-log_offsets": (
        "npa_airflow.slurm.triggers.SlurmJobTrigger",
        {**_SLURM_KWARGS, "log_offsets": {"/shared/results/run-1/slurm-42.out": 12}},
    ),
    # The current handle, with its script and sidecar (`_SLURM_HANDLE` is the shape of before they were named).
    "slurm-handle-with-script-and-sidecar": (
        "npa_airflow.slurm.triggers.SlurmJobTrigger",
        {
            **_SLURM_KWARGS,
            "handle": {
                **_SLURM_HANDLE,
                "script_path": "/shared/results/sbatch/npa-dag-task-abc1234567-t1.sbatch",
                "env_file": "/shared/results/sidecars/npa-dag-task-abc1234567-t1.env",
            },
        },
    ),
}


def _trigger_classpaths() -> list[str]:
    found = set()
    for module_info in pkgutil.walk_packages(npa_airflow.__path__, "npa_airflow."):
        module = importlib.import_module(module_info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            # an abstract base (common/owned_trigger.py) is never a row: only what it is extended into
            if issubclass(cls, BaseTrigger) and cls.__module__ == module.__name__ and not inspect.isabstract(cls):
                found.add(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(found)


TRIGGER_CLASSPATHS = _trigger_classpaths()

# Runs in the throwaway AIRFLOW_HOME: write each row, commit, read it back in a new session, rebuild the trigger
# as the triggerer does (classpath + kwargs), and report what the rebuilt trigger serialises to.
_ROUND_TRIP = r"""
import json, sys
from airflow.jobs.triggerer_job_runner import TriggerRunner
from airflow.models.trigger import Trigger
from airflow.utils.session import create_session

rows = json.loads(sys.stdin.read())
report = {}
for key, (classpath, kwargs, construct) in rows.items():
    if construct:
        trigger = TriggerRunner().get_trigger_by_classpath(classpath)(**kwargs)
        row = Trigger.from_object(trigger)
    else:
        row = Trigger(classpath=classpath, kwargs=kwargs)
    with create_session() as session:
        session.add(row)
        session.flush()
        row_id = row.id
    with create_session() as session:
        stored = session.get(Trigger, row_id)
        raw = stored.encrypted_kwargs
        rebuilt = TriggerRunner().get_trigger_by_classpath(stored.classpath)(**stored.kwargs)
        again_classpath, again_kwargs = rebuilt.serialize()
    report[key] = {
        "stored_classpath": stored.classpath,
        "raw": raw,
        "classpath": again_classpath,
        "kwargs": json.loads(json.dumps(again_kwargs)),
    }
print("REPORT " + json.dumps(report))
"""


def _serialized(classpath: str, kwargs: dict) -> tuple[str, dict]:
    module_name, _, name = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module_name), name)(**kwargs)
    again_classpath, again_kwargs = trigger.serialize()
    return again_classpath, json.loads(json.dumps(again_kwargs))


@pytest.fixture(scope="module")
def trigger_table(tmp_path_factory) -> dict[str, dict]:
    """Round-trip every sample and legacy row through a real, migrated metadata DB; the report per row."""
    from cryptography.fernet import Fernet

    home = tmp_path_factory.mktemp("airflow-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__FERNET_KEY=Fernet.generate_key().decode(),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
    )
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    rows = {cp: (cp, SAMPLE_KWARGS[cp], True) for cp in TRIGGER_CLASSPATHS if cp in SAMPLE_KWARGS}
    rows.update({key: (cp, kwargs, False) for key, (cp, kwargs) in LEGACY_ROWS.items()})
    out = subprocess.run(
        [sys.executable, "-c", _ROUND_TRIP],
        input=json.dumps(rows),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


def test_the_scan_finds_the_known_triggers():
    assert {
        "npa_airflow.slurm.triggers.SlurmJobTrigger",
        "npa_airflow.slurm.convert_trigger.SqshConvertTrigger",
        "npa_airflow.burst.triggers.BurstJobTrigger",
    } <= set(TRIGGER_CLASSPATHS)


@pytest.mark.parametrize("classpath", TRIGGER_CLASSPATHS)
def test_trigger_round_trips_through_the_trigger_table(classpath, trigger_table):
    assert classpath in SAMPLE_KWARGS, f"add constructor kwargs for {classpath} to SAMPLE_KWARGS in {__file__}"
    expected_classpath, expected_kwargs = _serialized(classpath, SAMPLE_KWARGS[classpath])
    row = trigger_table[classpath]
    assert expected_classpath == classpath
    assert row["stored_classpath"] == classpath
    assert (row["classpath"], row["kwargs"]) == (expected_classpath, expected_kwargs)
    # Stored encrypted with the Fernet key: neither plain JSON nor any readable kwarg value.
    assert not row["raw"].startswith("{")
    if "handle" in expected_kwargs:
        assert str(expected_kwargs["handle"]["conn_id"]) not in row["raw"]


@pytest.mark.parametrize("key", sorted(LEGACY_ROWS))
def test_rows_of_earlier_versions_still_rebuild(key, trigger_table):
    classpath, kwargs = LEGACY_ROWS[key]
    current = {k: v for k, v in kwargs.items() if k != "log_offsets"}
    assert (trigger_table[key]["classpath"], trigger_table[key]["kwargs"]) == _serialized(classpath, current)
    # the handle is read back as the same job (a row keeps the handle's dict; the trigger holds it typed)
    from npa_airflow.slurm.handle import SlurmJobHandle

    rebuilt = trigger_table[key]["kwargs"]["handle"]
    assert SlurmJobHandle.from_dict(rebuilt) == SlurmJobHandle.from_dict(kwargs["handle"])
