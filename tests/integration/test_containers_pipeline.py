"""Preflight, .sqsh conversion, NCCL probe and the full pipeline DAG on the real local cluster.

Everything runs through `dag.test()` in a subprocess with its own AIRFLOW_HOME (a real metadata DB; Airflow
runs deferred triggers in-process there) against the loopback Slurm cluster over real SSH. Pyxis and Enroot
are the test stand-ins from tests/standins (the cluster's PATH): `enroot import` builds a real squashfs, and
`srun --container-image` accepts only a valid .sqsh file. The probe is real torchrun with gloo across two
nodes. What ran on the cluster is checked with sacct, by job name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.harness.airflow_tasks import job_name as job_name_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.accounting("checks with sacct which jobs ran since the test began, long after MinJobAge"),
]

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
AIRFLOW = str(Path(PYTHON).with_name("airflow"))
SEED_CONVERT_MEM_MB = 7200

RUNNER = textwrap.dedent(
    """
    import importlib.util, json, sys
    from sqlalchemy import select
    spec = importlib.util.spec_from_file_location("dag_under_test", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dr = module.dag.test(run_conf=json.loads(sys.argv[2]))
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    out = {"state": str(dr.state), "run_id": dr.run_id, "tasks": {}}
    with create_session() as session:
        for ti in dr.get_task_instances(session=session):
            rows = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id, XComModel.task_id == ti.task_id
                )
            ).all()
            xcom = {}
            for row in rows:
                value = row.value
                if isinstance(value, str):
                    try:
                        value = json.loads(value)
                    except ValueError:
                        pass
                xcom[row.key] = value
            out["tasks"][ti.task_id] = {"state": str(ti.state), "xcom": xcom}
    print("NPA_RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, slurm_cluster) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow-home-containers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="false",
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW_CONN_SLURM_DEFAULT=slurm_cluster.conn_uri_json,
        PYTHONPATH=str(REPO),
    )
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    (home / "dags").mkdir()
    (home / "run_dag_test.py").write_text(RUNNER)
    return env


def run_dag(env: dict[str, str], dag_file: Path, conf: dict | None = None, timeout: float = 420) -> tuple[dict, str]:
    target = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / dag_file.name
    target.write_text(dag_file.read_text())
    proc = subprocess.run(
        [PYTHON, str(Path(env["AIRFLOW_HOME"]) / "run_dag_test.py"), str(target), json.dumps(conf or {})],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("NPA_RESULT ")]
    assert lines, f"dag.test produced no result (rc {proc.returncode}):\n{output[-8000:]}"
    return json.loads(lines[-1][len("NPA_RESULT ") :]), output


def jobs_named(cluster_ssh, prefix: str, since: str, at_least: int = 0, timeout: float = 60) -> list[dict[str, str]]:
    """Accounted jobs whose name starts with `prefix`; waits up to `timeout` s for `at_least` of them to show:
    slurmdbd records a job after slurmctld has already answered for it (the poller falls back to squeue)."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster_ssh(
            f"sacct -X -n --parsable2 --starttime={since} -o JobID,JobName,State,ExitCode,Partition", check=True
        ).stdout
        jobs = []
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 5 and parts[1].startswith(prefix):
                jobs.append({"id": parts[0], "name": parts[1], "state": parts[2].split()[0], "exit": parts[3],
                             "partition": parts[4]})  # fmt: skip
        if len(jobs) >= at_least or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


def sacct_now(cluster_ssh) -> str:
    # sacct --starttime takes the cluster's local time; one second back so nothing submitted now is missed.
    return cluster_ssh("date -d '-1 second' +%Y-%m-%dT%H:%M:%S", check=True).stdout.strip()


@pytest.fixture
def convert_mem(slurm_cluster) -> str:
    """The seed's 7200M when the CPU nodes are that large; the loopback cluster's nodes may be configured
    smaller, and Slurm refuses a job no node can hold. Read from slurm.conf: no controller round trip."""
    conf = Path(slurm_cluster.slurm_conf).read_text()
    line = next(ln for ln in conf.splitlines() if ln.startswith("NodeName=c1 "))
    real = int(line.split("RealMemory=", 1)[1].split()[0])
    return f"{SEED_CONVERT_MEM_MB}M" if real >= SEED_CONVERT_MEM_MB else f"{min(2000, real // 2)}M"


@pytest.fixture
def dataset(slurm_cluster, cluster_ssh):
    path = f"{slurm_cluster.shared}/data/containers-it-{uuid.uuid4().hex[:8]}"
    cluster_ssh(f"mkdir -p {path} && printf 'a\\n' > {path}/part-0 && printf 'b\\n' > {path}/part-1", check=True)
    yield f"lustre://{path}"
    cluster_ssh(f"rm -rf {path}")


PIPELINE = REPO / "dags_examples" / "slurm_training.py"


def test_pipeline_runs_end_to_end_then_reuses_the_sqsh_and_the_probe(
    request, airflow_env, slurm_cluster, cluster_ssh, convert_mem, dataset
):
    image = f"registry.local/npa/pytorch:it-{uuid.uuid4().hex[:8]}"
    sqsh = f"{slurm_cluster.sqsh_dir}/registry.local+npa+pytorch+{image.rsplit(':', 1)[1]}.sqsh"
    conf = {"image": image, "dataset": dataset, "convert_mem": convert_mem}
    since = sacct_now(cluster_ssh)
    request.addfinalizer(lambda: cluster_ssh(f"rm -f {sqsh}"))

    first, output = run_dag(airflow_env, PIPELINE, conf)
    states = {t: v["state"] for t, v in first["tasks"].items()}
    assert first["state"] == "success", f"{states}\n{output[-8000:]}"
    assert first["tasks"]["convert"]["xcom"]["return_value"] == sqsh
    assert first["tasks"]["probe"]["xcom"]["return_value"] == {}  # the first knob set (none) works here
    metrics = first["tasks"]["collect"]["xcom"]["return_value"]["metrics"]
    assert metrics["world_size"] == 2
    assert metrics["dataset_entries"] == 2
    assert metrics["image"] == sqsh  # the training ran "in" the converted image (srun stand-in saw it)

    convert_jobs = jobs_named(cluster_ssh, "npa-slurm-training-convert-", since, at_least=1)
    assert [(j["state"], j["partition"]) for j in convert_jobs] == [("COMPLETED", "cpu")]
    probe_jobs = jobs_named(cluster_ssh, "npa-slurm-training-probe-", since, at_least=1)
    assert [(j["state"], j["partition"]) for j in probe_jobs] == [("COMPLETED", "gpu")]
    train_jobs = jobs_named(cluster_ssh, "npa-slurm-training-train-", since, at_least=1)
    assert [(j["state"], j["partition"]) for j in train_jobs] == [("COMPLETED", "gpu")]
    check = cluster_ssh(f"head -c 4 {sqsh}; echo; unsquashfs -s {sqsh} >/dev/null && echo valid", check=True)
    assert check.stdout.split() == ["hsqs", "valid"]

    since = sacct_now(cluster_ssh)
    second, output = run_dag(airflow_env, PIPELINE, conf)
    assert second["state"] == "success", output[-8000:]
    assert second["tasks"]["convert"]["xcom"]["return_value"] == sqsh
    assert "no conversion job submitted" in output
    assert jobs_named(cluster_ssh, "npa-slurm-training-convert-", since) == []
    assert jobs_named(cluster_ssh, "npa-slurm-training-probe-", since) == []  # cached working env
    assert len(jobs_named(cluster_ssh, "npa-slurm-training-train-", since, at_least=1)) == 1


def test_truncated_conversion_fails_and_no_gpu_job_is_submitted(
    airflow_env, slurm_cluster, cluster_ssh, convert_mem, dataset
):
    # The Enroot stand-in writes a truncated image for `truncate-me`; `-silent` even exits 0.
    tag = uuid.uuid4().hex[:8]
    image = f"registry.local/npa/truncate-me-silent:{tag}"
    sqsh = f"{slurm_cluster.sqsh_dir}/registry.local+npa+truncate-me-silent+{tag}.sqsh"
    since = sacct_now(cluster_ssh)
    result, output = run_dag(airflow_env, PIPELINE, {"image": image, "dataset": dataset, "convert_mem": convert_mem})
    states = {t: v["state"] for t, v in result["tasks"].items()}
    assert result["state"] == "failed"
    assert states["convert"] == "failed", f"{states}\n{output[-8000:]}"
    assert states["probe"] == states["train"] == states["collect"] == "upstream_failed"
    assert "no image was published" in output
    assert "no GPU job may fall back to the registry image" in output
    convert_jobs = jobs_named(cluster_ssh, "npa-slurm-training-convert-", since, at_least=1)
    assert [j["state"] for j in convert_jobs] == ["FAILED"]
    assert jobs_named(cluster_ssh, "npa-slurm-training-probe-", since) == []
    assert jobs_named(cluster_ssh, "npa-slurm-training-train-", since) == []
    leftovers = cluster_ssh(f"ls {slurm_cluster.sqsh_dir} | grep -c -- {tag} || true").stdout.strip()
    assert leftovers == "0", f"files for {image} left in the cache: {sqsh}"


def test_preflight_catches_a_missing_dataset_before_anything_is_written(airflow_env, slurm_cluster, cluster_ssh):
    missing = f"{slurm_cluster.shared}/data/no-such-{uuid.uuid4().hex[:8]}"
    since = sacct_now(cluster_ssh)
    result, output = run_dag(
        airflow_env, PIPELINE, {"image": "registry.local/npa/never:1", "dataset": f"lustre://{missing}"}
    )
    states = {t: v["state"] for t, v in result["tasks"].items()}
    assert states["preflight"] == "failed"
    assert all(s == "upstream_failed" for t, s in states.items() if t != "preflight"), states
    assert f"dataset lustre://{missing}: does not exist (test -e on the login host)" in output
    assert "Fix: stage the data on shared storage" in output
    assert "nothing was written or submitted" in output
    assert jobs_named(cluster_ssh, "npa-slurm-training-", since) == []
    # Nothing of this run reached shared storage: no script, no results directory, no image.
    names = [job_name_for("slurm_training", t, result["run_id"], None, 1) for t in ("convert", "probe", "train")]
    names.append(names[1].replace("-t1", "-k0-t1"))
    root = slurm_cluster.results_root
    paths = [p for n in names for p in (f"{root}/{n}", f"{root}/sbatch/{n}.sbatch")]
    paths.append(f"{slurm_cluster.sqsh_dir}/registry.local+npa+never+1.sqsh")
    present = cluster_ssh(" ; ".join(f"test -e {p} && echo {p}" for p in paths) + " ; true", check=True).stdout
    assert present.strip() == ""


@pytest.mark.parametrize("root", [None, "missing"], ids=["no-dataset-anywhere", "connection-dataset-root"])
def test_the_pipelines_dataset_defaults_to_the_connections_dataset_root(airflow_env, slurm_cluster, root):
    """No `dataset` param: the connection's extra dataset_root is the data (a missing one is refused by preflight,
    which proves it was read); with neither, the first task says what to set."""
    missing = f"{slurm_cluster.shared}/data/no-such-root-{uuid.uuid4().hex[:8]}"
    conn = json.loads(slurm_cluster.conn_uri_json)
    conn["extra"].pop("dataset_root")
    if root:
        conn["extra"]["dataset_root"] = missing
    env = {**airflow_env, "AIRFLOW_CONN_SLURM_DEFAULT": json.dumps(conn)}
    result, output = run_dag(env, PIPELINE, {"image": "registry.local/npa/never:1"})
    states = {t: v["state"] for t, v in result["tasks"].items()}
    assert states["preflight"] == "failed", states
    if root:
        assert f"dataset {missing}: does not exist (test -e on the login host)" in output
    else:
        assert "no training data named: set the DAG param 'dataset'" in output
        assert "or the extra 'dataset_root' of the Slurm connection 'slurm_default'" in output


PROBE_DAG = textwrap.dedent(
    """
    from airflow.sdk import DAG
    from npa_airflow.slurm.operators import SlurmNcclProbeOperator

    with DAG(dag_id="npa_it_probe_escalation", schedule=None, catchup=False) as dag:
        SlurmNcclProbeOperator(
            task_id="probe",
            nodes=2,
            gpus_per_node=0,
            partition="cpu",
            timeout_seconds=60,  # the working set must finish in time even on a loaded 2-core machine
            poll_interval=2,
            retries=0,
            # Test-only knob of the probe script: rank 0 stalls unless NCCL_P2P_DISABLE is set, like the
            # intra-node P2P hang; the first knob set (none) must time out and the second must work.
            extra_env={"NPA_PROBE_TEST_HANG_UNLESS": "NCCL_P2P_DISABLE"},
        )
    """
)


def test_probe_hang_escalates_to_the_next_knob_set_and_caches_it(airflow_env, tmp_path, cluster_ssh):
    dag_file = tmp_path / "npa_it_probe_escalation.py"
    dag_file.write_text(PROBE_DAG)
    since = sacct_now(cluster_ssh)
    result, output = run_dag(airflow_env, dag_file)
    assert result["state"] == "success", output[-8000:]
    assert result["tasks"]["probe"]["xcom"]["return_value"] == {"NCCL_P2P_DISABLE": "1"}, output[-8000:]
    jobs = jobs_named(cluster_ssh, "npa-npa-it-probe-escalation-probe-", since, at_least=2)
    jobs = sorted(jobs, key=lambda j: int(j["id"]))
    assert [(j["name"].rsplit("-", 2)[-2], j["state"], j["exit"]) for j in jobs] == [
        ("k0", "FAILED", "124:0"),
        ("k1", "COMPLETED", "0:0"),
    ]
    assert "hung or timed out" in output
    assert "NCCL_PROBE_OK world_size=2 backend=gloo" in output

    variable = subprocess.run(
        [AIRFLOW, "variables", "get", "npa_nccl_env::slurm_default::cpu"],
        env=airflow_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(variable)["env"] == {"NCCL_P2P_DISABLE": "1"}
    # Later runs skip the probe on this cached set (shown for the pipeline in its second run).


CREDENTIALS_DAG = textwrap.dedent(
    """
    from airflow.sdk import DAG
    from npa_airflow.slurm.operators import SlurmEnrootCredentialsOperator, SlurmSqshConvertOperator

    with DAG(dag_id="npa_it_enroot_credentials", schedule=None, catchup=False) as dag:
        creds = SlurmEnrootCredentialsOperator(task_id="credentials", registry_conn_id="npa_it_registry")
        convert = SlurmSqshConvertOperator(
            task_id="convert", image="{{ dag_run.conf['image'] }}", mem="{{ dag_run.conf['mem'] }}",
            poll_interval=2, retries=0,
        )
        creds >> convert
    """
)


def test_credentials_are_installed_without_leaking_and_unlock_a_private_image(
    airflow_env, tmp_path, slurm_cluster, cluster_ssh, convert_mem
):
    # The Enroot stand-in refuses images under `private` unless the credentials file (mode 600) names the
    # registry, failing like real Enroot does ("Could not process JSON input").
    token = uuid.uuid4().hex[:10]
    registry = f"reg-{token}.local"
    secret = f"s3cret-{uuid.uuid4().hex}"
    image = f"{registry}/private/model:1"
    sqsh = f"{slurm_cluster.sqsh_dir}/{registry}+private+model+1.sqsh"
    before = cluster_ssh(f"cd /tmp && enroot import -o /tmp/npa-it-{token}.sqsh docker://{registry}#private/model:1")
    assert before.returncode != 0 and "Could not process JSON input" in before.stderr

    env = {
        **airflow_env,
        "AIRFLOW_CONN_NPA_IT_REGISTRY": json.dumps(
            {"conn_type": "generic", "host": registry, "login": "$oauthtoken", "password": secret}
        ),
    }
    dag_file = tmp_path / "npa_it_enroot_credentials.py"
    dag_file.write_text(CREDENTIALS_DAG)
    try:
        result, output = run_dag(env, dag_file, {"image": image, "mem": convert_mem})
        assert result["state"] == "success", output[-8000:]
        assert result["tasks"]["convert"]["xcom"]["return_value"] == sqsh
        installed = result["tasks"]["credentials"]["xcom"]["return_value"]
        assert installed["mode"] == "600" and installed["machines"] == [registry]
        assert secret not in output  # task logs, trigger logs, the rendered scripts
        assert secret not in json.dumps(result)  # XCom
        creds = cluster_ssh(
            "f=~/.config/enroot/.credentials; stat -c %a $f; "
            f"grep -c 'machine {registry} login $oauthtoken password {secret}' $f",
            check=True,
        ).stdout.split()
        assert creds == ["600", "1"]
    finally:
        marks = "'# >>> npa-airflow npa_it_registry >>>' '# <<< npa-airflow npa_it_registry <<<'"
        cluster_ssh(
            f"f=~/.config/enroot/.credentials; set -- {marks}; "
            'awk -v b="$1" -v e="$2" \'$0==b{s=1;next} $0==e{s=0;next} !s\' "$f" > "$f.t" && '
            'chmod 600 "$f.t" && mv "$f.t" "$f"; rm -f ' + sqsh
        )
