"""Image references, the .sqsh cache names, and the .sqsh check (run in real bash on real squashfs files)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa_airflow.exceptions import NpaParseError, NpaValidationError
from npa_airflow.slurm.submit.images import (
    ImageRef,
    SqshStatus,
    build_sqsh_validate_command,
    is_latest,
    normalize_image_ref,
    parse_image_ref,
    parse_sqsh_validation,
    require_sqsh_image,
    sqsh_path_for,
)


@pytest.mark.parametrize(
    ("ref", "pyxis"),
    [
        ("/lustre/sqsh/pt.sqsh", "/lustre/sqsh/pt.sqsh"),
        ("./pt.sqsh", "./pt.sqsh"),
        ("nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
        ("docker://nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
        ("registry.local:5000/team/img:v1", "registry.local:5000#team/img:v1"),
        ("localhost/img:v1", "localhost#img:v1"),
        ("ubuntu:22.04", "ubuntu:22.04"),
        ("ubuntu", "ubuntu:latest"),
        ("nvidia/cuda:12.4.1-base", "nvidia/cuda:12.4.1-base"),
        ("docker://ubuntu:22.04", "ubuntu:22.04"),
        ("  nvcr.io/nvidia/pytorch:24.01-py3 ", "nvcr.io#nvidia/pytorch:24.01-py3"),
    ],
)
def test_normalize_accepts_enroot_and_docker_forms(ref: str, pyxis: str) -> None:
    assert normalize_image_ref(ref) == pyxis


def test_enroot_uri_and_fields() -> None:
    ref = parse_image_ref("nvcr.io/nvidia/pytorch:24.01-py3")
    assert ref == ImageRef(
        original="nvcr.io/nvidia/pytorch:24.01-py3",
        registry="nvcr.io",
        repository="nvidia/pytorch",
        tag="24.01-py3",
        tag_explicit=True,
    )
    assert ref.enroot_uri == "docker://nvcr.io#nvidia/pytorch:24.01-py3"
    assert parse_image_ref("ubuntu:22.04").enroot_uri == "docker://ubuntu:22.04"
    with pytest.raises(NpaValidationError, match=r"already a \.sqsh"):
        _ = parse_image_ref("/a/b.sqsh").enroot_uri


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("pt.sqsh", "relative .sqsh path"),
        ("../pt.sqsh", "relative .sqsh path"),
        ("/lustre/image.tar", "not a .sqsh file"),
        ("/lustre/.sqsh", "no file name"),
        ("oras://reg/img:1", "scheme 'oras'"),
        ("https://reg/img:1", "scheme 'https'"),
        ("nvcr.io/nvidia/PyTorch:1", "invalid image path component 'PyTorch'"),
        ("nvcr.io/nvidia/pytorch:bad tag", "whitespace"),
        ("nvcr.io/nvidia/pytorch:-x", "invalid tag '-x'"),
        ("nvcr.io/nvidia/pytorch:", "invalid tag ''"),
        ("#img:1", "empty registry"),
        ("bad_host#img:1", "invalid registry host"),
        ("nvcr.io/", "names no image"),
        ("nvcr.io//x:1", "invalid image path component ''"),
        ("img;rm -rf /:1", "whitespace"),
        ("img$(id):1", "invalid image path component"),
        ("user@nvcr.io#img:1", "user name"),
        ("nvcr.io/img@sha256:" + "a" * 64, "digest"),
        ("nvcr.io/img:1\nx", "line break"),
        ("/lustre/a\x00.sqsh", "NUL"),
    ],
)
def test_bad_references_are_rejected_with_the_field_and_a_fix(ref: str, fragment: str) -> None:
    with pytest.raises(NpaValidationError) as err:
        parse_image_ref(ref, field="image")
    assert fragment in str(err.value)
    assert str(err.value).startswith("image=")


def test_latest_detection() -> None:
    assert is_latest("ubuntu")
    assert is_latest("nvcr.io/nvidia/pytorch:latest")
    assert is_latest("docker://nvcr.io#nvidia/pytorch")
    assert not is_latest("nvcr.io/nvidia/pytorch:24.01-py3")
    assert not is_latest("/lustre/latest.sqsh")
    assert not parse_image_ref("ubuntu").tag_explicit


def test_sqsh_path_for_is_stable_and_same_for_equivalent_references() -> None:
    cache = "/shared/sqsh/"
    forms = [
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "nvcr.io#nvidia/pytorch:24.01-py3",
        "docker://nvcr.io#nvidia/pytorch:24.01-py3",
    ]
    paths = {sqsh_path_for(f, cache) for f in forms}
    assert paths == {"/shared/sqsh/nvcr.io+nvidia+pytorch+24.01-py3.sqsh"}
    hub = {sqsh_path_for(f, "/c") for f in ("ubuntu:22.04", "docker://ubuntu:22.04", "docker.io/library/ubuntu:22.04")}
    assert hub == {"/c/docker.io+library+ubuntu+22.04.sqsh"}
    assert sqsh_path_for("ubuntu", "/c") == "/c/docker.io+library+ubuntu+latest.sqsh"
    assert sqsh_path_for("registry.local:5000/a/b:1", "/c") == "/c/registry.local_5000+a+b+1.sqsh"
    assert sqsh_path_for("/x/given.sqsh", "/c") == "/x/given.sqsh"


def test_sqsh_path_for_distinguishes_different_images() -> None:
    refs = ["a/b:c", "a/b-c:latest", "a:b", "reg.io/a/b:c", "reg.io/a/b:d", "a/b/c:d"]
    names = [sqsh_path_for(r, "/c") for r in refs]
    assert len(set(names)) == len(names)


def test_sqsh_path_for_long_names_are_bounded_and_distinct() -> None:
    long_a = "reg.io/" + "/".join(["component"] * 30) + ":a"
    long_b = "reg.io/" + "/".join(["component"] * 30) + ":b"
    a, b = sqsh_path_for(long_a, "/c"), sqsh_path_for(long_b, "/c")
    assert a != b
    assert len(a.rsplit("/", 1)[1]) <= 200
    assert a.endswith(".sqsh")


@pytest.mark.parametrize(("cache", "fragment"), [("", "is empty"), ("rel/dir", "not absolute"), ("/", "root")])
def test_bad_cache_dir(cache: str, fragment: str) -> None:
    with pytest.raises(NpaValidationError, match=fragment):
        sqsh_path_for("ubuntu:22.04", cache)


_SAFE_NAME = st.from_regex(r"\A[a-z0-9]{1,8}(?:[._-][a-z0-9]{1,8}){0,2}\Z")


@given(
    registry=st.one_of(st.none(), st.sampled_from(["nvcr.io", "reg.local:5000", "ghcr.io"])),
    path=st.lists(_SAFE_NAME, min_size=1, max_size=4),
    tag=st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z"),
)
def test_cache_name_is_filesystem_safe_and_round_trips(registry: str | None, path: list[str], tag: str) -> None:
    ref = f"{registry + '/' if registry else ''}{'/'.join(path)}:{tag}"
    if registry is None and "." in path[0] and len(path) > 1:
        return  # a dotted first component is a registry host by Docker's rule
    parsed = parse_image_ref(ref)
    name = parsed.cache_name
    assert "/" not in name and name.endswith(".sqsh")
    assert all(c.isalnum() or c in "._-+" for c in name)
    # The same image written in Enroot's form lands on the same file.
    assert parse_image_ref("docker://" + parsed.pyxis_ref).cache_name == name


def test_require_sqsh_image_refuses_registry_images() -> None:
    assert require_sqsh_image("/s/x.sqsh") == "/s/x.sqsh"
    assert require_sqsh_image("./x.sqsh") == "./x.sqsh"
    for ref in ("nvcr.io/nvidia/pytorch:24.01-py3", "docker://nvcr.io#nvidia/pytorch:1", "ubuntu"):
        with pytest.raises(NpaValidationError, match="inside the GPU allocation"):
            require_sqsh_image(ref)


def test_validate_command_quotes_the_path() -> None:
    cmd = build_sqsh_validate_command("/s/it's $(id).sqsh")
    assert cmd.endswith("npa_sqsh_check '/s/it'\"'\"'s $(id).sqsh' || true")
    with pytest.raises(NpaValidationError, match="not absolute"):
        build_sqsh_validate_command("x.sqsh")


@pytest.mark.parametrize(
    ("stdout", "status", "size", "expected"),
    [
        ("NPA_SQSH VALID 4096 242\n", SqshStatus.VALID, 4096, 242),
        ("banner\nNPA_SQSH MISSING\n", SqshStatus.MISSING, None, None),
        ("NPA_SQSH TRUNCATED 100 242", SqshStatus.TRUNCATED, 100, 242),
        ("NPA_SQSH BADMAGIC\n", SqshStatus.BAD_MAGIC, None, None),
    ],
)
def test_parse_validation(stdout: str, status: SqshStatus, size: int | None, expected: int | None) -> None:
    check = parse_sqsh_validation(stdout, "/p.sqsh")
    assert (check.status, check.size, check.expected_size) == (status, size, expected)
    assert check.valid is (status is SqshStatus.VALID)
    assert check.describe().startswith("/p.sqsh ")


@pytest.mark.parametrize("stdout", ["", "nothing here\n", "NPA_SQSH WHAT\n", "NPA_SQSH VALID x\n"])
def test_parse_validation_rejects_unknown_output(stdout: str) -> None:
    with pytest.raises(NpaParseError):
        parse_sqsh_validation(stdout, "/p.sqsh")


needs_squashfs = pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="squashfs-tools not installed")


def _check(path: Path) -> SqshStatus:
    out = subprocess.run(
        ["bash", "-c", build_sqsh_validate_command(str(path))], capture_output=True, text=True, check=True
    )
    return parse_sqsh_validation(out.stdout, str(path)).status


@needs_squashfs
def test_check_function_in_real_bash(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=test\n")
    (root / "blob").write_bytes(os.urandom(64 * 1024))  # incompressible: the image is larger than its padding
    good = tmp_path / "good image.sqsh"
    subprocess.run(["mksquashfs", str(root), str(good), "-quiet", "-noappend"], check=True, capture_output=True)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.sqsh"
    truncated.write_bytes(data[: len(data) // 4])
    header_only = tmp_path / "header.sqsh"
    header_only.write_bytes(data[:20])
    not_sqsh = tmp_path / "tar.sqsh"
    not_sqsh.write_bytes(b"\x00\x00PK" + b"x" * 100)
    directory = tmp_path / "dir.sqsh"
    directory.mkdir()

    assert _check(good) is SqshStatus.VALID
    assert _check(truncated) is SqshStatus.TRUNCATED
    assert _check(header_only) in (SqshStatus.CORRUPT, SqshStatus.TRUNCATED)
    assert _check(not_sqsh) is SqshStatus.BAD_MAGIC
    assert _check(directory) is SqshStatus.NOT_A_FILE
    assert _check(tmp_path / "absent.sqsh") is SqshStatus.MISSING
