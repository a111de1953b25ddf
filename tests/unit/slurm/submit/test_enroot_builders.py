"""The conversion job script and the Enroot credentials installer, rendered and run in real bash.

The conversion script runs here outside Slurm (its #SBATCH lines are comments to bash) with the Enroot
stand-in from tests/standins on PATH, so the import/validate/rename logic is exercised for real.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.enroot import (
    ConvertSpec,
    build_credentials_block,
    build_install_credentials_command,
    qos_memory_advice,
    render_convert_script,
)

STANDINS = Path(__file__).resolve().parents[3] / "standins"
needs_squashfs = pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="squashfs-tools not installed")


def _spec(tmp: Path | str = "/shared/sqsh", image: str = "nvcr.io/nvidia/pytorch:24.01-py3", **kw) -> ConvertSpec:
    values = {
        "image": image,
        "target": f"{tmp}/out.sqsh",
        "job_name": "npa-conv-0123456789-t1",
        "partition": "cpu",
        "stdout_path": "/shared/logs/%x-%j.out",
        "stderr_path": "/shared/logs/%x-%j.err",
    }
    values.update(kw)
    return ConvertSpec(**values)


def test_render_has_the_seed_profile() -> None:
    script = render_convert_script(_spec(account="proj1"))
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=npa-conv-0123456789-t1",
        "#SBATCH --partition=cpu",
        "#SBATCH --account=proj1",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=7200M",
        "#SBATCH --time=120",
        "#SBATCH --output=/shared/logs/%x-%j.out",
        "#SBATCH --error=/shared/logs/%x-%j.err",
        "#SBATCH --chdir=/tmp",
        "#SBATCH --no-requeue",
    ]
    assert "--exclusive" not in script
    assert "export TMPDIR=/tmp\n" in script
    assert 'export ENROOT_TEMP_PATH="/tmp/enroot-npa-${SLURM_JOB_ID}"' in script
    assert 'export SLURM_ENROOT_TEMP_PATH="${ENROOT_TEMP_PATH}"' in script
    assert "uri='docker://nvcr.io#nvidia/pytorch:24.01-py3'\n" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_render_quotes_the_target() -> None:
    script = render_convert_script(_spec(tmp="/shared/it's $(id)"))
    assert "target='/shared/it'\"'\"'s $(id)/out.sqsh'\n" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"image": "/shared/x.sqsh"}, "nothing to convert"),
        ({"image": "bad ref"}, "whitespace"),
        ({"target": "rel.sqsh"}, "absolute path ending in .sqsh"),
        ({"target": "/x/out.tar"}, "absolute path ending in .sqsh"),
        ({"partition": ""}, "set cpu_partition"),
        ({"partition": "cpu;rm"}, "not a partition name"),
        ({"cpus": 0}, "cpus=0"),
        ({"mem": "lots"}, "QOSGrpMemLimit"),
        ({"mem": "0"}, "mem='0'"),
        ({"time_minutes": 30}, "at least 120"),
        ({"stdout_path": "/shared/my logs/x.out"}, "#SBATCH line"),
        ({"job_name": "bad name"}, "not a valid job name"),
        ({"account": "a b"}, "account"),
    ],
)
def test_convert_spec_rejects_bad_input(overrides: dict, fragment: str) -> None:
    with pytest.raises(NpaValidationError, match=fragment.replace("(", r"\(")):
        _spec(**overrides)


def test_qos_advice_only_for_memory_reasons() -> None:
    advice = qos_memory_advice("42", "QOSGrpMemLimit", "cpu_long", 4, "7200M")
    assert advice is not None
    assert "scontrol show job 42" in advice and "-p cpu_long -c4 --mem=7200M" in advice
    assert "never move the conversion into a GPU allocation" in advice
    assert qos_memory_advice("42", "Resources", "cpu", 4, "7200M") is None
    assert qos_memory_advice("42", None, "cpu", 4, "7200M") is None


def _run_convert(
    tmp_path: Path, image: str, job_id: str = "777", force: bool = False
) -> tuple[subprocess.CompletedProcess[str], Path]:
    cache = tmp_path / "sqsh"
    cache.mkdir(exist_ok=True)
    spec = _spec(tmp=str(cache), image=image, force=force)
    env = {
        **os.environ,
        "PATH": f"{STANDINS}:{os.environ['PATH']}",
        "SLURM_JOB_ID": job_id,
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        ["bash", "-c", render_convert_script(spec)], capture_output=True, text=True, env=env, timeout=60
    )
    return result, Path(spec.target)


@needs_squashfs
def test_convert_script_publishes_a_valid_image_and_cleans_up(tmp_path: Path) -> None:
    result, target = _run_convert(tmp_path, "registry.local/npa/ok:1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "NPA_CONVERT_OK" in result.stdout
    first = target.read_bytes()
    assert first[:4] == b"hsqs"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.sqsh"]
    assert not Path("/tmp/enroot-npa-777").exists()
    content = subprocess.run(["unsquashfs", "-cat", str(target), "etc/npa-image"], capture_output=True, text=True)
    assert content.stdout.strip() == "docker://registry.local#npa/ok:1"

    again, _ = _run_convert(tmp_path, "registry.local/npa/ok:1", job_id="778")
    assert again.returncode == 0
    assert "already valid" in again.stdout
    assert target.read_bytes() == first

    forced, _ = _run_convert(tmp_path, "registry.local/npa/ok:1", job_id="779", force=True)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "NPA_CONVERT_FORCED" in forced.stdout
    assert target.read_bytes() != first  # a fresh import (the stand-in's payload is random)
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.sqsh"]


@needs_squashfs
@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("registry.local/npa/truncate-me:1", "enroot import exited 1"),
        ("registry.local/npa/truncate-me-silent:1", "enroot import produced an invalid image"),
        ("registry.local/npa/fail-me:1", "enroot import exited 1"),
    ],
)
def test_failed_or_truncated_import_leaves_no_file(tmp_path: Path, image: str, why: str) -> None:
    result, target = _run_convert(tmp_path, image)
    assert result.returncode == 1
    assert f"NPA_CONVERT_FAILED {why}" in result.stdout
    assert list(target.parent.iterdir()) == []


@needs_squashfs
def test_truncated_leftover_at_target_is_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "sqsh"
    cache.mkdir()
    (cache / "out.sqsh").write_bytes(b"hsqs" + b"\0" * 100)
    result, target = _run_convert(tmp_path, "registry.local/npa/ok:1")
    assert result.returncode == 0, result.stdout + result.stderr
    check = subprocess.run(["unsquashfs", "-s", str(target)], capture_output=True)
    assert check.returncode == 0


def test_credentials_block_for_ngc_has_both_hosts() -> None:
    block = build_credentials_block("nvcr.io", "$oauthtoken", "s3cr3t", key="ngc").decode()
    assert block.splitlines() == [
        "# >>> npa-airflow ngc >>>",
        "machine nvcr.io login $oauthtoken password s3cr3t",
        "machine authn.nvidia.com login $oauthtoken password s3cr3t",
        "# <<< npa-airflow ngc <<<",
    ]
    other = build_credentials_block("registry.local:5000", "me", "pw", key="reg").decode()
    assert "authn.nvidia.com" not in other


@pytest.mark.parametrize(
    ("registry", "login", "password", "fragment"),
    [
        ("", "u", "p", "host"),
        ("nvcr.io/x", "u", "p", "host"),
        ("nvcr.io", "", "p", "login"),
        ("nvcr.io", "u", "two words", "password"),
        ("nvcr.io", "u", "line\nbreak", "password"),
    ],
)
def test_credentials_block_rejects_bad_input(registry: str, login: str, password: str, fragment: str) -> None:
    with pytest.raises(NpaValidationError, match=fragment):
        build_credentials_block(registry, login, password, key="k")


def test_credentials_error_never_quotes_the_secret() -> None:
    with pytest.raises(NpaValidationError) as err:
        build_credentials_block("nvcr.io", "u", "top secret", key="k")
    assert "top secret" not in str(err.value)


def _install(home: Path, block: bytes, key: str) -> subprocess.CompletedProcess[bytes]:
    command = build_install_credentials_command(key)
    assert b"password" not in command.encode()
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    return subprocess.run(["bash", "-c", command], input=block, capture_output=True, env=env, check=True)


def test_install_credentials_merges_atomically_in_real_bash(tmp_path: Path) -> None:
    creds = tmp_path / ".config" / "enroot" / ".credentials"
    creds.parent.mkdir(parents=True)
    creds.write_text("machine other.io login a password b\n")
    out = _install(tmp_path, build_credentials_block("nvcr.io", "$oauthtoken", "one", key="ngc"), "ngc")
    assert out.stdout.decode() == f"NPA_CREDENTIALS {creds} 600\n"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    _install(tmp_path, build_credentials_block("nvcr.io", "$oauthtoken", "two", key="ngc"), "ngc")
    _install(tmp_path, build_credentials_block("reg.local", "me", "pw", key="reg"), "reg")
    lines = creds.read_text().splitlines()
    assert lines == [
        "# >>> npa-airflow reg >>>",
        "machine reg.local login me password pw",
        "# <<< npa-airflow reg <<<",
        "# >>> npa-airflow ngc >>>",
        "machine nvcr.io login $oauthtoken password two",
        "machine authn.nvidia.com login $oauthtoken password two",
        "# <<< npa-airflow ngc <<<",
        "machine other.io login a password b",
    ]
    assert [p.name for p in creds.parent.iterdir()] == [".credentials"]
