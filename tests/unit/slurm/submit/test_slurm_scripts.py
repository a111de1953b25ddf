"""render_sbatch (golden files, bash -n, real-bash runs), lint_script and bash_syntax_check.

The real-bash runs execute the rendered script with local stand-ins for ``srun`` and ``scontrol``
(test doubles: no Slurm daemon runs inside a unit test; the integration test submits the same
script to the real cluster). The stand-in srun runs the task command once per simulated node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.scripts import (
    assert_script_clean,
    bash_syntax_check,
    container_arguments,
    lint_script,
    render_sbatch,
    sbatch_directives,
    srun_arguments,
)
from npa_airflow.slurm.submit.spec import SbatchSpec

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("NPA_REGEN_GOLDEN") == "1"


def golden_single() -> SbatchSpec:
    return SbatchSpec(
        job_name="npa-train-fit-0123456789-t1",
        command="python train.py --config {config_path}",
        log_dir="/lustre/logs",
        results_dir="/lustre/results/run-1",
        partition="polar",
        account="tao",
        image="/lustre/sqsh/tao-pyt-5.5.0.sqsh",
        container_mounts=("/lustre/data:/data:ro", "/lustre/results:/results"),
        environment={"NCCL_P2P_DISABLE": "1", "RUN_NOTE": "it's a $test"},
        pre_commands=("mkdir -p {results_dir}/checkpoints",),
        post_commands=("ls {results_dir}/checkpoints",),
        leader_post_commands=("cp {results_dir}/checkpoints/last.pt {results_dir}/model.pt",),
        env_file="/lustre/results/run-1/.job.env",
        extra_sbatch=("--qos=high",),
    ).bind(config_path="/lustre/results/run-1/spec.yaml", results_dir="/lustre/results/run-1")


def golden_multi() -> SbatchSpec:
    return SbatchSpec(
        job_name="npa-train-fit-0123456789-t2",
        command="torchrun --nnodes=$WORLD_SIZE --nproc-per-node=$NUM_GPU_PER_NODE --node-rank=$NODE_RANK "
        "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py",
        log_dir="/lustre/logs",
        results_dir="/lustre/results/run-2",
        partition="polar",
        nodes=4,
        gpus_per_node=8,
        image="/lustre/sqsh/tao-pyt-5.5.0.sqsh",
        requeue=False,
        exclude_nodes=("g7", "g9"),
    )


def golden_checkpoint() -> SbatchSpec:
    """A multi-node job in an image with a checkpoint warning (the task passes the signal on: see the template), the
    third segment of a long run (NPA_CONTINUE_FILE)."""
    return SbatchSpec(
        job_name="npa-train-fit-0123456789-s3-t3",
        command="torchrun --nnodes=$WORLD_SIZE --nproc-per-node=$NUM_GPU_PER_NODE --node-rank=$NODE_RANK "
        "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py --resume",
        log_dir="/lustre/logs",
        results_dir="/lustre/results/run-3",
        partition="polar",
        nodes=2,
        gpus_per_node=8,
        time_hours=2,
        image="/lustre/sqsh/tao-pyt-5.5.0.sqsh",
        environment={"NCCL_DEBUG": "WARN"},
        checkpoint_signal="sigusr1@600",
        max_segments=12,
        segment=3,
    )


GOLDEN_CASES = [
    ("singlenode.sbatch", golden_single),
    ("multinode.sbatch", golden_multi),
    ("multinode_checkpoint.sbatch", golden_checkpoint),
]


@pytest.mark.parametrize(("name", "make"), GOLDEN_CASES)
def test_golden_render(name, make):
    rendered = render_sbatch(make())
    path = GOLDEN / name
    if REGEN:
        path.write_text(rendered)
    assert path.exists(), f"missing golden file {path}: regenerate with NPA_REGEN_GOLDEN=1 pytest {__file__}"
    assert rendered == path.read_text(), (
        f"{name} differs from its golden file. If the change is intended, regenerate with "
        f"NPA_REGEN_GOLDEN=1 pytest {__file__} and review the diff."
    )


def test_the_built_in_parts_leave_most_of_airflows_rendered_field_to_the_users_commands():
    """Airflow shows a rendered field whole up to [core] max_templated_field_length (4,096 by default): the
    script's own parts, multi-node with a sidecar, a container and typical paths, leave 500 characters of it.
    (The explanations of the template are Jinja comments, out of the rendered script.)"""
    from airflow.configuration import conf

    limit = int(conf.get_default_value("core", "max_templated_field_length"))
    spec = SbatchSpec(
        job_name="npa-a-dag-a-task-0123456789-t1",
        command="true",
        log_dir="/shared/logs",
        results_dir="/shared/results/npa-a-dag-a-task-0123456789-t1",
        nodes=2,
        image="/shared/sqsh/image.sqsh",
        env_file="/shared/results/npa-a-dag-a-task-0123456789-t1/.job.env",
    )
    assert len(render_sbatch(spec)) <= limit - 500


def test_render_is_deterministic_and_lint_clean():
    for make in (golden_single, golden_multi, golden_checkpoint):
        assert render_sbatch(make()) == render_sbatch(make())
        assert lint_script(render_sbatch(make())) == []


def test_multinode_is_a_strict_superset_of_single_node():
    single = render_sbatch(SbatchSpec(job_name="j", command="true", log_dir="/l", results_dir="/r"))
    multi = render_sbatch(SbatchSpec(job_name="j", command="true", log_dir="/l", results_dir="/r", nodes=2))
    multi_lines = multi.splitlines()
    for line in single.splitlines():
        if "--nodes=" in line or "--ntasks=" in line or "singlenode" in line or "1 node(s)" in line:
            continue
        assert line in multi_lines, line
    needles = ["#SBATCH --wait-all-nodes=1", "#SBATCH --ntasks-per-node=1", "export WORLD_SIZE=2"]
    needles += [" MASTER_PORT=29500 ", 'NODE_RANK="${SLURM_NODEID}"', "TAO_NODE_COUNT", "TAO_NODE_RANK"]
    for needle in needles:
        assert needle in multi and needle not in single


def test_directives():
    base = {"job_name": "j", "command": "true", "log_dir": "/l", "results_dir": "/r"}
    d = sbatch_directives(SbatchSpec(**base))
    assert d == sorted(d)
    assert "--requeue" in d and "--gres=gpu:4" in d and "--exclusive" not in d and "--time=240" in d
    assert not any(x.startswith(("--partition", "--account", "--exclude")) for x in d)
    d = sbatch_directives(SbatchSpec(**base, gpus_per_node=0, requeue=False, partition="cpu"))
    assert "--no-requeue" in d and "--partition=cpu" in d and not any(x.startswith("--gres") for x in d)
    assert "--exclusive" in sbatch_directives(SbatchSpec(**base, gpus_per_node=8))
    assert srun_arguments(SbatchSpec(**base)) == ["--ntasks=1", "--ntasks-per-node=1"]


def test_unbound_placeholder_is_a_clear_render_error():
    spec = SbatchSpec(job_name="j", command="run {config_path}", log_dir="/l", results_dir="/r")
    with pytest.raises(NpaValidationError, match="no config_path value"):
        render_sbatch(spec)


# --------------------------------------------------------------------------------------------- bash -n


AWKWARD_COMMANDS = [
    "echo 'single' \"double\" $HOME ${HOME} $(date) `date` | cat ; echo done",
    "cat <<EOF > /dev/null\n  } unbalanced brace in a heredoc\nEOF\necho after-heredoc",
    "for i in 1 2; do\n  echo $i\ndone",
    "python -c 'import sys; print({\"a\": 1})'",
]


@pytest.mark.parametrize("command", AWKWARD_COMMANDS)
@pytest.mark.parametrize("nodes", [1, 3])
def test_every_render_passes_bash_n(command, nodes):
    spec = SbatchSpec(
        job_name="j", command=command, log_dir="/l", results_dir="/r with space/x", nodes=nodes,
        pre_commands=(command,), post_commands=(command,), leader_post_commands=(command,),
        environment={"V": "a'b\"c$d`e\\f\ng"}, env_file="/s/.env", placeholders_bound=True,
    )  # fmt: skip
    bash_syntax_check(render_sbatch(spec))
    bash_syntax_check(render_sbatch(golden_single()))
    bash_syntax_check(render_sbatch(golden_multi()))
    bash_syntax_check(render_sbatch(golden_checkpoint()))


def test_bash_syntax_check_reports_bash_message():
    spec = SbatchSpec(job_name="j", command="if then fi", log_dir="/l", results_dir="/r")
    with pytest.raises(NpaValidationError, match=r"not valid bash \(bash -n\).*syntax error"):
        bash_syntax_check(render_sbatch(spec))


# --------------------------------------------------------------------------------------------- lint

FAKE_GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
FAKE_HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("export HF_TOKEN=abc123", "credential-like assignment HF_TOKEN"),
        ("DB_PASSWORD='hunter22'", "credential-like assignment DB_PASSWORD"),
        ('AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI"', "credential-like assignment AWS_SECRET_ACCESS_KEY"),
        ("python x.py api_key=abcdef", "credential-like assignment api_key"),
        ("aws configure set aws_access_key_id " + "AKIA" + "ABCDEFGHIJKLMNOP", "AWS access key id"),
        ("git clone https://" + FAKE_GITHUB + "@github.com/x/y", "GitHub token"),
        ("echo " + FAKE_HF, "Hugging Face token"),
        ("curl -H 'Authorization: Bearer nvapi-" + "abcdefghijklmnopqrstuvwxyz" + "'", "NVIDIA API key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key block"),
        ("ngc config set --api-key abcdef123", "flag"),
        ("huggingface-cli login --token=abcdef123", "flag"),
    ],
)
def test_lint_finds_credentials(line, kind):
    findings = lint_script(f"#!/bin/bash\n{line}\n")
    assert any(kind in f and f.startswith("line 2:") for f in findings), findings


@pytest.mark.parametrize(
    "line",
    [
        'export HF_TOKEN="$HF_TOKEN"',
        "export HF_TOKEN=${HF_TOKEN}",
        "TOKENIZERS_PARALLELISM=false python train.py --tokenizer=bert",
        "PASSWORD_FILE=/run/secrets/pw",
        "export HF_TOKEN=",
        'huggingface-cli login --token "$HF_TOKEN"',
    ],
)
def test_lint_allows_references(line):
    assert lint_script(line) == []


def test_lint_known_secret_is_reported_without_the_value():
    secret = "s3cr3t-value-xyz"
    findings = lint_script(f"echo ok\necho {secret}\n", secrets=[secret, "", "ab"])
    assert "line 2: contains known secret value #1" in findings
    assert any("shorter than 4" in f for f in findings)
    assert all(secret not in f for f in findings)
    with pytest.raises(NpaValidationError, match="sidecar") as err:
        assert_script_clean(f"echo {secret}", secrets=[secret])
    assert secret not in str(err.value)


def test_spec_secrets_never_reach_a_clean_render():
    spec = SbatchSpec(job_name="j", command="python t.py", log_dir="/l", results_dir="/r", env_file="/r/.env")
    assert lint_script(render_sbatch(spec), secrets=["the-real-token-value"]) == []


# --------------------------------------------------------------------------------------------- real bash

SRUN_STANDIN = r"""#!/bin/bash
# Test double for srun (no Slurm here): runs the task once per simulated node, returns the highest rc.
n=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in --ntasks=*) n=${1#--ntasks=} ;; esac
  printf '%s\n' "$1" >> "$NPA_TEST_DIR/srun-args"
  shift
done
rc=0
for ((i = 0; i < n; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME=c$((i + 1)) "$@" || { r=$?; ((r > rc)) && rc=$r; }
done
exit $rc
"""
SCONTROL_STANDIN = """#!/bin/bash
# Test double for scontrol: 'show hostnames', and 'show job' answered from $NPA_TEST_DIR/scontrol-job if present.
case "$1 $2" in
  "show hostnames") printf 'c1\\nc2\\n' ;;
  "show job") if [ -f "$NPA_TEST_DIR/scontrol-job" ]; then cat "$NPA_TEST_DIR/scontrol-job"; else exit 1; fi ;;
esac
"""


def run_script(
    tmp_path: Path, spec: SbatchSpec, srun: str = SRUN_STANDIN, **env_extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, text in (("srun", srun), ("scontrol", SCONTROL_STANDIN)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "c[1-2]",
        "NPA_TEST_DIR": str(tmp_path),
        "HOME": str(tmp_path),
        **env_extra,
    }
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False,
        preexec_fn=_signals_as_slurmstepd_leaves_them,
    )  # fmt: skip
    return proc, Path(spec.results_dir)


def _signals_as_slurmstepd_leaves_them() -> None:
    """slurmstepd starts a job's script and tasks with every signal at its default. A test run under nohup or as a
    background job inherits SIGHUP or SIGINT ignored, which bash then cannot trap (a trap of a signal ignored on
    entry is silently void): the script would not be tested as Slurm runs it."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)


def make(tmp_path: Path, command: str, **overrides) -> SbatchSpec:
    results = tmp_path / "results"
    trace = tmp_path / "trace"
    values = {
        "job_name": "npa-t-0123456789-t1",
        "command": command,
        "log_dir": str(tmp_path / "logs"),
        "results_dir": str(results),
        "pre_commands": (f"echo pre-$SLURM_PROCID >> {trace}",),
        "post_commands": (f"echo post-$SLURM_PROCID >> {trace}",),
        "leader_post_commands": (f"echo leader-$SLURM_PROCID >> {trace}",),
        "placeholders_bound": True,
        **overrides,
    }
    return SbatchSpec(**values)


def trace(tmp_path: Path) -> list[str]:
    path = tmp_path / "trace"
    return path.read_text().split() if path.exists() else []


def test_single_node_success_writes_status_json(tmp_path):
    proc, results = run_script(tmp_path, make(tmp_path, f"echo primary-$SLURM_PROCID >> {tmp_path / 'trace'}"))
    assert proc.returncode == 0, proc.stderr
    assert trace(tmp_path) == ["pre-0", "primary-0", "post-0", "leader-0"]
    assert (results / "child_exit_code").read_text() == "0\n"
    status = json.loads((results / "status.json").read_text())
    assert status["job_id"] == "4242" and status["state"] == "COMPLETE" and status["exit_code"] == 0
    assert status["job_name"] == "npa-t-0123456789-t1"
    assert sorted(p.name for p in results.iterdir()) == ["child_exit_code", "status.json"]  # no temp files
    assert "--container-image" not in (tmp_path / "srun-args").read_text()


def test_single_node_failure_records_exit_code_and_no_marker(tmp_path):
    proc, results = run_script(tmp_path, make(tmp_path, "echo about to fail\nexit 3"))
    assert proc.returncode == 3
    assert trace(tmp_path) == ["pre-0"]  # post and leader post run only after success
    assert (results / "child_exit_code").read_text() == "3\n"
    assert not (results / "status.json").exists()


def test_a_run_removes_an_earlier_runs_end_record_before_its_command(tmp_path):
    """child_exit_code is the end record the poller reads while accounting lags: a requeued run starts without
    the one its earlier run left."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "child_exit_code").write_text("143\n")
    seen = tmp_path / "seen"
    command = f'if [ -e "$NPA_CHILD_EXIT_CODE_FILE" ]; then echo stale > {seen}; else echo none > {seen}; fi'
    spec = make(tmp_path, command)
    proc, results = run_script(tmp_path, spec)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == "none\n" and (results / "child_exit_code").read_text() == "0\n"


def test_failing_pipeline_inside_the_primary_fails_the_job(tmp_path):
    proc, results = run_script(tmp_path, make(tmp_path, "false | cat\necho should-not-print"))
    assert proc.returncode == 1
    assert "should-not-print" not in proc.stdout
    assert not (results / "status.json").exists()


def test_child_timeout_kills_the_primary(tmp_path):
    spec = make(tmp_path, "sleep 30", time_hours=0.01, timeout_hours=0.0004)  # 1 s child timeout
    proc, results = run_script(tmp_path, spec)
    assert proc.returncode == 124
    assert (results / "child_exit_code").read_text() == "124\n"
    assert not (results / "status.json").exists()


def test_sidecar_is_sourced_and_shredded(tmp_path):
    sidecar = tmp_path / "sidecar" / "job.env"
    sidecar.parent.mkdir()
    sidecar.write_text("HF_TOKEN=the-session-token\n")
    sidecar.chmod(0o600)
    seen = tmp_path / "seen"
    spec = make(tmp_path, f'printf %s "$HF_TOKEN" > {seen}', env_file=str(sidecar))
    proc, _ = run_script(tmp_path, spec)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == "the-session-token"  # exported to the task (set -a)
    assert not sidecar.exists()
    assert "the-session-token" not in proc.stdout + proc.stderr + render_sbatch(spec)


def test_missing_sidecar_fails_clearly(tmp_path):
    proc, results = run_script(tmp_path, make(tmp_path, "true", env_file=str(tmp_path / "gone.env")))
    assert proc.returncode == 97
    assert "npa: sidecar" in proc.stderr and "is missing" in proc.stderr
    assert not (results / "status.json").exists()


def test_multi_node_rendezvous_and_leader_only_post(tmp_path):
    out = tmp_path / "ranks"
    command = f'echo "rank=$NODE_RANK world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT gpus=$NUM_GPU_PER_NODE tao=$TAO_NODE_COUNT/$TAO_NODE_RANK" >> {out}'  # noqa: E501
    spec = make(tmp_path, command, nodes=2, gpus_per_node=0, image="/sqsh/x.sqsh", container_mounts=("/a:/b",))
    proc, results = run_script(tmp_path, spec)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().splitlines() == [
        "rank=0 world=2 master=c1:29500 gpus=0 tao=2/0",
        "rank=1 world=2 master=c1:29500 gpus=0 tao=2/1",
    ]
    assert trace(tmp_path) == ["pre-0", "post-0", "leader-0", "pre-1", "post-1"]
    assert (tmp_path / "srun-args").read_text().split() == [
        "--ntasks=2", "--ntasks-per-node=1", "--container-image=/sqsh/x.sqsh",
        f"--container-mounts=/a:/b,{results}", f"--container-workdir={results}",
        "--container-env=NPA_RESULTS_DIR,NPA_CHILD_EXIT_CODE_FILE,NPA_CHILD_TIMEOUT_SECONDS,MASTER_ADDR",
    ]  # fmt: skip
    assert (results / "status.json").exists()


def test_one_failing_node_fails_the_job(tmp_path):
    spec = make(tmp_path, 'if [ "$NODE_RANK" = 1 ]; then exit 5; fi', nodes=2, gpus_per_node=0)
    proc, results = run_script(tmp_path, spec)
    assert proc.returncode == 5
    assert (results / "child_exit_code").read_text() == "5\n"
    assert not (results / "status.json").exists()
    assert stat.S_ISREG((results / "child_exit_code").stat().st_mode)


# --------------------------------------------------------------------------------------------- containers

PYXIS_SRUN_DOUBLE = r"""#!/bin/bash
# Test double for srun under Pyxis (no Slurm, no container here), for its environment and directory rules only:
# the "image" sets every NAME=VALUE of $NPA_TEST_IMAGE_ENV, overriding the job's value unless --container-env
# lists NAME; the step starts in --container-workdir (else $HOME, as for an image without a WORKDIR).
n=1 keep=, workdir=$HOME
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --ntasks=*) n=${1#--ntasks=} ;;
    --container-env=*) keep=,${1#--container-env=}, ;;
    --container-workdir=*) workdir=${1#--container-workdir=} ;;
  esac
  printf '%s\n' "$1" >> "$NPA_TEST_DIR/srun-args"
  shift
done
for pair in $NPA_TEST_IMAGE_ENV; do
  [[ $keep == *",${pair%%=*},"* ]] || export "$pair"
done
cd "$workdir" || exit 1
rc=0
for ((i = 0; i < n; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME=c$((i + 1)) "$@" || { r=$?; ((r > rc)) && rc=$r; }
done
exit $rc
"""
IMAGE_ENV = (
    "WORLD_SIZE NUM_GPU_PER_NODE MASTER_ADDR MASTER_PORT NODE_RANK TAO_NODE_COUNT TAO_GPUS_PER_NODE TAO_NODE_RANK "
    "NPA_RESULTS_DIR NPA_CHILD_EXIT_CODE_FILE NPA_CHILD_TIMEOUT_SECONDS RUN_NOTE HF_TOKEN"
).split()


def test_job_variables_win_over_an_images_env_and_the_step_starts_in_the_results_dir(tmp_path):
    """An image that sets every variable the job sets (Pyxis lets its ENV win unless --container-env lists the
    name): the command still sees the job's values, and a relative path lands in the results dir."""
    sidecar = tmp_path / "job.env"
    sidecar.write_text("export HF_TOKEN=from-the-sidecar\n")
    sidecar.chmod(0o600)
    seen = tmp_path / "seen"
    names = " ".join(f"{n}=${n}" for n in IMAGE_ENV)
    spec = make(
        tmp_path, f'echo "{names}" >> {seen}; echo here >> relative.txt', nodes=2, gpus_per_node=2,
        image="/sqsh/x.sqsh", environment={"RUN_NOTE": "from-the-job"}, env_file=str(sidecar),
        secret_env_names=("HF_TOKEN",),
    )  # fmt: skip
    image_env = " ".join(f"{n}=image" for n in IMAGE_ENV)
    proc, results = run_script(tmp_path, spec, PYXIS_SRUN_DOUBLE, NPA_TEST_IMAGE_ENV=image_env)
    assert proc.returncode == 0, proc.stderr
    rows = [dict(pair.split("=", 1) for pair in line.split(" ")) for line in seen.read_text().splitlines()]
    for rank, row in enumerate(rows):
        assert "image" not in row.values(), row
        assert row["NODE_RANK"] == row["TAO_NODE_RANK"] == str(rank)
        assert row["WORLD_SIZE"] == row["TAO_NODE_COUNT"] == "2" and row["NUM_GPU_PER_NODE"] == "2"
        assert (row["MASTER_ADDR"], row["MASTER_PORT"]) == ("c1", "29500")
        assert row["NPA_RESULTS_DIR"] == str(results) and row["HF_TOKEN"] == "from-the-sidecar"
        assert row["RUN_NOTE"] == "from-the-job"
    assert len(rows) == 2 and (results / "relative.txt").read_text() == "here\nhere\n"


@pytest.mark.parametrize("nodes", [1, 2])
def test_every_name_the_script_exports_before_srun_is_kept_in_the_container(nodes):
    """Guards the template and JOB_ENV_NAMES together: a new host-side export must join --container-env."""
    spec = SbatchSpec(
        job_name="j", command="true", log_dir="/l", results_dir="/r", nodes=nodes, image="/i.sqsh",
        environment={"B_VAR": "1", "A_VAR": "2"}, env_file="/s/.env", secret_env_names=("HF_TOKEN",),
    )  # fmt: skip
    script = render_sbatch(spec)
    exported = {m.group(1) for m in re.finditer(r"^export ([A-Za-z_][A-Za-z0-9_]*)=", script, re.M)}
    listed = re.search(r"--container-env=(\S+)", script).group(1).split(",")
    assert exported | {"HF_TOKEN"} == set(listed) and len(listed) == len(set(listed))


def test_container_arguments_mount_inputs_and_honour_an_explicit_workdir():
    spec = SbatchSpec(
        job_name="j", command="true", log_dir="/l", results_dir="/shared/results/j", image="/i.sqsh",
        inputs=("lustre:///shared/data/set", "/shared/results/j/in"), container_workdir="/work dir",
        container_mounts=("/code:/code:ro",),
    )  # fmt: skip
    assert spec.inputs == ("/shared/data/set", "/shared/results/j/in")
    args = container_arguments(spec)
    assert args[1:3] == [
        '--container-mounts=/code:/code:ro,"${NPA_RESULTS_DIR}",/shared/data/set',
        "--container-workdir='/work dir'",
    ]
    assert container_arguments(SbatchSpec(job_name="j", command="true", log_dir="/l", results_dir="/r")) == []
