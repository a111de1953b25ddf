"""Secret canary: a unique token in every credential the provider handles must surface nowhere.

Slurm: the HF token (delivered through the mode-600 sidecar), the passphrase of the connection's SSH
key, and a registry password installed for Enroot (whose one legitimate home is Enroot's mode-600
credentials file). Burst: the registry password (SkyPilot docker login secret) and the SkyPilot API token. Each pipeline
runs through ``dag.test()`` in a subprocess with its own AIRFLOW_HOME, so the task logs, XComs and
rendered template fields are the real ones in the real metadata DB. Afterwards the token is searched
for, byte by byte, in: the dag.test() output (task logs), every file under AIRFLOW_HOME (logs and the
SQLite DB holding XCom and rendered fields), and, as root, every file of the local cluster (shared
storage with the rendered script, job stdout/stderr and results, the cluster user's home, Slurm's state
and logs, the accounting DB). A positive control proves the search finds a planted token.

The job proves it received the HF token by comparing its SHA-256 (never the token) and reports the
sidecar's mode while it runs; the sidecar must be gone once the job ended.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
CANARY = f"npacanary{uuid.uuid4().hex}"
HF_TOKEN = f"hf_{CANARY}hf"
PASSPHRASE = f"pass-{CANARY}"
REGISTRY_PASSWORD = f"reg-{CANARY}"
ENROOT_PASSWORD = f"ngc-{CANARY}"
ENROOT_CONN = "npa_canary_registry"
SKYPILOT_TOKEN = f"sky-{CANARY}"

RUNNER = textwrap.dedent(
    """
    import json, runpy, sys
    ns = runpy.run_path(sys.argv[1])
    dag = ns["dag"]
    run = dag.test()
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print("NPA_STATES " + json.dumps(states))
    """
)


def find_canary(paths: list[str]) -> list[str]:
    """Files under ``paths`` (searched as root, binary too) that contain the canary."""
    existing = [p for p in paths if os.path.exists(p)]
    if not existing:
        return []
    proc = subprocess.run(["grep", "-r", "-l", "-a", "-F", CANARY, *existing], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout.splitlines()


def airflow_env(home: Path, **connections: dict) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        PYTHONPATH=str(REPO),
    )
    for conn_id, value in connections.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(value)
    return env


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory) -> Path:
    """One migrated metadata DB, copied into each test's AIRFLOW_HOME (migrating takes ~15 s)."""
    home = tmp_path_factory.mktemp("airflow-template")
    subprocess.run([AIRFLOW, "db", "migrate"], env=airflow_env(home), check=True, capture_output=True, timeout=300)
    return home / "airflow.db"


def run_dag(env: dict[str, str], db: Path, dag_source: str, timeout: float = 420) -> tuple[dict[str, str], str]:
    home = Path(env["AIRFLOW_HOME"])
    (home / "dags").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(db, home / "airflow.db")
    dag_file = home / "dags" / "canary_dag.py"
    dag_file.write_text(dag_source)
    assert CANARY not in dag_source  # credentials come from connections only
    runner = home / "run.py"
    runner.write_text(RUNNER)
    proc = subprocess.run(
        [sys.executable, str(runner), str(dag_file)], env=env, capture_output=True, text=True, timeout=timeout
    )
    output = proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("NPA_STATES ")]
    assert lines, f"dag.test() gave no result (rc {proc.returncode}):\n{output[-5000:]}"
    return json.loads(lines[-1].split(" ", 1)[1]), output


def test_search_finds_a_planted_canary(tmp_path):
    """Positive control for the searches below."""
    planted = tmp_path / "deep" / "planted.bin"
    planted.parent.mkdir()
    planted.write_bytes(b"\x00\xff binary " + CANARY.encode() + b" tail")
    assert find_canary([str(tmp_path)]) == [str(planted)]


@pytest.mark.integration
def test_slurm_pipeline_leaks_neither_hf_token_nor_key_passphrase(slurm_cluster, migrated_db, tmp_path, cluster_ssh):
    key = tmp_path / "id_with_passphrase"
    shutil.copyfile(slurm_cluster.key_file, key)
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-f", str(key), "-P", "", "-N", PASSPHRASE], check=True)
    assert CANARY.encode() not in key.read_bytes()
    results_root = f"{slurm_cluster.shared}/tests/canary-{uuid.uuid4().hex[:8]}"
    slurm_conn = json.loads(slurm_cluster.conn_uri_json)
    slurm_conn["password"] = PASSPHRASE  # the key's passphrase
    slurm_conn["extra"]["key_file"] = str(key)
    slurm_conn["extra"]["results_root"] = results_root
    hf_conn = {"conn_type": "generic", "host": "huggingface.co", "login": "hf", "password": HF_TOKEN}
    registry = {"conn_type": "generic", "host": "registry.example.com", "login": "robot", "password": ENROOT_PASSWORD}
    home = tmp_path / "airflow"
    env = airflow_env(home, slurm_canary=slurm_conn, hf_canary=hf_conn, **{ENROOT_CONN: registry})
    digest = hashlib.sha256(HF_TOKEN.encode()).hexdigest()
    # The job checks the token by digest and reports the sidecar's mode; it prints the token nowhere.
    command = (
        'sidecar="$(dirname {results_dir})/sidecars/$(basename {results_dir}).env"; '
        'echo "sidecar-mode $(stat -c %a "$sidecar")"; '
        f'[ "$(printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1)" = {digest} ] && echo token-delivered; '
        "env | grep -c HF_TOKEN >/dev/null"
    )
    dag_source = textwrap.dedent(
        f"""
        import pendulum
        from airflow.sdk import DAG
        from npa_airflow.slurm.operators import SlurmEnrootCredentialsOperator
        from npa_airflow.slurm.operators import SlurmSubmitOperator

        START = pendulum.datetime(2026, 1, 1)
        with DAG("npa_secret_canary_slurm", schedule=None, start_date=START, catchup=False) as dag:
            SlurmSubmitOperator(
                task_id="train", slurm_conn_id="slurm_canary", partition="cpu", gpus_per_node=0, cpus_per_task=1,
                time_hours=0.1, poll_interval=2, secret_env={{"HF_TOKEN": "conn:hf_canary"}},
                command={command!r},
            )
            SlurmEnrootCredentialsOperator(
                task_id="enroot_credentials", registry_conn_id={ENROOT_CONN!r}, slurm_conn_id="slurm_canary"
            )
        """
    )
    user_home = cluster_ssh("echo $HOME", check=True).stdout.strip()
    credentials = f"{user_home}/.config/enroot/.credentials"
    try:
        states, output = run_dag(env, migrated_db, dag_source)
        in_cluster = sorted(set(find_canary([slurm_cluster.dir, user_home])))
        mode = cluster_ssh(f"stat -c %a {credentials}").stdout.strip()
    finally:  # take our block out of the cluster user's Enroot credentials again
        begin, end = f"# >>> npa-airflow {ENROOT_CONN} >>>", f"# <<< npa-airflow {ENROOT_CONN} <<<"
        cluster_ssh(
            f"f={credentials}; [ -f $f ] && awk -v b='{begin}' -v e='{end}' "
            "'$0==b{skip=1;next} $0==e{skip=0;next} !skip' $f > $f.tmp && chmod 600 $f.tmp && mv -f $f.tmp $f"
        )
    assert states == {"train": "success", "enroot_credentials": "success"}, output[-5000:]
    assert "token-delivered" in output and "sidecar-mode 600" in output  # streamed from the job's stdout

    leaks = {
        "dag.test output (task logs)": CANARY in output,
        "AIRFLOW_HOME (logs, metadata DB with XCom and rendered fields)": find_canary([str(home)]),
        # the one place a credential belongs: Enroot's own credentials file (mode 600), checked below
        "cluster files": [f for f in in_cluster if f != credentials],
    }
    assert not any(leaks.values()), f"the canary leaked: {leaks}"
    assert in_cluster == [credentials] and mode == "600", (in_cluster, mode)
    listing = cluster_ssh(f"ls -A {results_root}/sidecars", check=True).stdout.split()
    assert listing == [], f"sidecar left behind: {listing}"


@pytest.fixture(scope="module")
def skypilot_endpoint():
    """The local SkyPilot API server (dev/skypilot), started here only if it is not running."""
    script = REPO / "dev" / "skypilot"
    running = subprocess.run([str(script), "status"], capture_output=True).returncode == 0
    if not running:
        subprocess.run([str(script), "up"], check=True, timeout=900)
    env = dict(
        line.removeprefix("export ").split("=", 1)
        for line in subprocess.run([str(script), "env"], check=True, capture_output=True, text=True).stdout.splitlines()
    )
    yield env["NPA_SKY_ENDPOINT"].strip("'")
    if not running:
        subprocess.run([str(script), "down"], timeout=120)


@pytest.mark.skypilot
@pytest.mark.slow
def test_burst_launch_leaks_neither_registry_password_nor_api_token(skypilot_endpoint, migrated_db, tmp_path):
    """A launch that reaches the real API server (which then fails it: no cloud catalog offline) carries the
    registry login as SkyPilot secrets and the API token as a Bearer header; neither may come back."""
    home = tmp_path / "airflow"
    env = airflow_env(
        home,
        skypilot_canary={"conn_type": "skypilot", "host": skypilot_endpoint, "extra": {"token": SKYPILOT_TOKEN}},
        registry_canary={
            "conn_type": "generic", "host": "registry.example.com", "login": "robot", "password": REGISTRY_PASSWORD,
        },
    )  # fmt: skip
    cluster = f"npa-canary-{uuid.uuid4().hex[:6]}"
    dag_source = textwrap.dedent(
        f"""
        import pendulum
        from airflow.sdk import DAG
        from npa_airflow.burst.operators import BurstTorchrunOperator

        START = pendulum.datetime(2026, 1, 1)
        with DAG("npa_secret_canary_burst", schedule=None, start_date=START, catchup=False) as dag:
            BurstTorchrunOperator(
                task_id="train", skypilot_conn_id="skypilot_canary", registry_conn_id="registry_canary",
                image="registry.example.com/team/train:1", nodes=2, accelerators="H100:8",
                command="python train.py", infra="aws", cluster_name={cluster!r}, poll_interval=1, retries=0,
            )
        """
    )
    states, output = run_dag(env, migrated_db, dag_source)
    assert states == {"train": "failed"}, output[-5000:]
    assert "launch request" in output and "launch of cluster" in output  # the request reached the server
    leaks = {
        "dag.test output (task logs)": CANARY in output,
        "AIRFLOW_HOME (logs, metadata DB with XCom and rendered fields)": find_canary([str(home)]),
    }
    assert not any(leaks.values()), f"the canary leaked: {leaks}"
