"""Bad inputs are refused with a specific error before anything reaches the cluster (table in docs/reliability.md).

Local cases: the connections point where nothing listens and every SSH connect / SkyPilot request is
counted; the error must be the expected validation error with zero attempts. Cluster cases: a read-only
check on the real cluster refuses the input; no job with the task's name exists and nothing was written.

The doc's table is rendered from ``bad_inputs.CASES`` and the messages raised in this run; when they
differ the last test fails. Regenerate with
``NPA_UPDATE_DOCS=1 .venv/bin/pytest tests/reliability/test_reliability_bad_inputs.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import asyncssh
import bad_inputs
import pytest
from bad_inputs import CASES, SESSION, Case

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
BEGIN, END = "<!-- bad-inputs:begin (generated) -->", "<!-- bad-inputs:end -->"
MESSAGES: dict[str, str] = {}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bad-input-keys")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "id")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "other")], check=True)
    (directory / "known_hosts").write_text("")
    (directory / "home").mkdir()
    SESSION["yaml_dir"] = str(directory)
    return directory


@pytest.fixture(autouse=True)
def connections(keys: Path, monkeypatch) -> None:
    extra = {
        "key_file": str(keys / "id"),
        "known_hosts": str(keys / "known_hosts"),
        "results_root": "/shared/results",
        "partition": "gpu",
        "sqsh_cache_dir": "/shared/sqsh",
    }
    unreachable = {"conn_type": "slurm", "host": "127.0.0.1", "port": 1, "login": "npa", "extra": extra}
    no_host_key = {**unreachable, "extra": {k: v for k, v in extra.items() if k != "known_hosts"}}
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_UNREACHABLE", json.dumps(unreachable))
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_NO_HOST_KEY", json.dumps(no_host_key))
    monkeypatch.setenv(
        "AIRFLOW_CONN_SKYPILOT_UNREACHABLE", json.dumps({"conn_type": "skypilot", "host": "http://127.0.0.1:1"})
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_REGISTRY_INCOMPLETE",
        json.dumps({"conn_type": "generic", "host": "registry.example.com", "login": "robot"}),
    )


@pytest.fixture
def attempts(monkeypatch) -> list[str]:
    """Every SSH connect and SkyPilot request made during the test, in order."""
    from npa_airflow.burst import client

    seen: list[str] = []
    connect = asyncssh.connect

    def counting_connect(host, port=(), *args, **kwargs):
        seen.append(f"ssh {host}:{port}")
        return connect(host, port, *args, **kwargs)

    monkeypatch.setattr(asyncssh, "connect", counting_connect)
    for cls in (client.SkyPilotClient, client.AsyncSkyPilotClient):
        send = cls.send

        def counting_send(self, request, *args, _send=send, **kwargs):
            seen.append(f"skypilot {request.path}")
            return _send(self, request, *args, **kwargs)

        monkeypatch.setattr(cls, "send", counting_send)
    return seen


def _id(case: Case) -> str:
    return case.id


def _check(case: Case, exc: BaseException) -> str:
    message = str(exc)
    missing = [w for w in case.words if w not in message]
    assert not missing, f"{case.id}: message lacks {missing}: {message!r}"
    MESSAGES[case.id] = message
    return message


@pytest.mark.parametrize("case", [c for c in CASES if not c.cluster], ids=_id)
def test_refused_before_any_connection(case: Case, attempts, keys, monkeypatch):
    if case.id == "host-key-missing":
        monkeypatch.setenv("HOME", str(keys / "home"))  # no ~/.ssh/known_hosts to fall back on
    with pytest.raises(case.error) as err:
        case.run()
    assert type(err.value) is case.error or isinstance(err.value, case.error)
    assert attempts == [], f"{case.id}: validation came after {attempts}"
    _check(case, err.value)


@pytest.fixture(scope="module")
def cluster_session(slurm_cluster, keys):
    from npa_airflow.slurm.hook import SlurmHook

    SESSION["run_id"] = f"manual__bad-inputs-{uuid.uuid4().hex[:8]}"
    SESSION["results_root"] = f"{slurm_cluster.shared}/tests/bad-inputs-{uuid.uuid4().hex[:8]}"
    SESSION["missing_input"] = f"{slurm_cluster.shared}/data/no-such-dataset"
    SESSION["cluster_dir"] = slurm_cluster.dir
    SESSION["login_port"] = str(slurm_cluster.port)
    wrong = keys / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{slurm_cluster.port} {(keys / 'other.pub').read_text()}")
    conn = json.loads(slurm_cluster.conn_uri_json)
    conn["extra"]["known_hosts"] = str(wrong)
    os.environ["AIRFLOW_CONN_SLURM_WRONG_HOST_KEY"] = json.dumps(conn)
    yield SlurmHook("slurm_default")
    os.environ.pop("AIRFLOW_CONN_SLURM_WRONG_HOST_KEY", None)


@pytest.mark.integration
@pytest.mark.parametrize("case", [c for c in CASES if c.cluster], ids=_id)
def test_refused_by_a_read_only_check_with_nothing_written(case: Case, cluster_session):
    hook = cluster_session
    with pytest.raises(case.error) as err:
        case.run()
    _check(case, err.value)
    assert hook.find_jobs_by_name([bad_inputs.job_name()]) == []
    assert hook.paths_exist([SESSION["results_root"]]) == {SESSION["results_root"]: False}


DOC_LOGIN_PORT = "2222"


def normalize(message: str) -> str:
    text = message
    for path, name in (
        (SESSION["yaml_dir"], "$DAG_FOLDER"),
        (os.environ.get("NPA_CLUSTER_DIR", "\0"), "$NPA_CLUSTER_DIR"),
    ):
        text = text.replace(path, name)
    text = re.sub(r"/var/tmp/npa-cluster[A-Za-z0-9_.-]*", "$NPA_CLUSTER_DIR", text)
    # The table shows the default (22.05) bed's login port whichever bed ran (the 24.11 bed's is 2232).
    text = text.replace(f"127.0.0.1:{SESSION.get('login_port', DOC_LOGIN_PORT)}", f"127.0.0.1:{DOC_LOGIN_PORT}")
    text = re.sub(r"bad-inputs-[0-9a-f]{8}", "bad-inputs-<run>", text)
    return text


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>").strip()


def render_table() -> str:
    rows = ["| # | where the value goes | input | error | message (as raised) |", "|---|---|---|---|---|"]
    for number, case in enumerate(CASES, start=1):
        message = normalize(MESSAGES[case.id])
        where = case.surface + (" (checked on the cluster, read-only)" if case.cluster else "")
        rows.append(f"| {number} | {cell(where)} | `{cell(case.shown)}` | {case.error.__name__} | {cell(message)} |")
    return "\n".join([BEGIN, *rows, END])


def test_doc_table_matches_the_cases():
    """docs/reliability.md lists every case with the message raised in this run."""
    absent = [c.id for c in CASES if c.id not in MESSAGES]
    if absent:
        pytest.skip(f"run the whole module (with the cluster) to check the doc; not run here: {absent[:5]}...")
    assert len(CASES) >= 30
    table = render_table()
    text = DOC.read_text() if DOC.exists() else ""
    current = text[text.find(BEGIN) : text.find(END) + len(END)] if BEGIN in text and END in text else ""
    if os.environ.get("NPA_UPDATE_DOCS") == "1":
        DOC.write_text(text.replace(current, table) if current else text + "\n" + table + "\n")
        return
    assert current == table, (
        "docs/reliability.md's bad-input table is out of date; regenerate it with "
        "NPA_UPDATE_DOCS=1 .venv/bin/pytest tests/reliability/test_reliability_bad_inputs.py"
    )
