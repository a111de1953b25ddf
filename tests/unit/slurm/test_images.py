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
from npa_airflow.slurm.images import (
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


def test_parse_validation_of_an_image_with_device_nodes_names_them_and_the_fix() -> None:
    stdout = (
        "NPA_SQSH_DEVICE /dev/console\nNPA_SQSH_DEVICE /dev/my null\nNPA_SQSH_DEVICE /dev/zero\n"
        "npa: /p.sqsh holds device nodes. (advice)\nNPA_SQSH DEVICES 4096 4000 8\n"
    )
    check = parse_sqsh_validation(stdout, "/p.sqsh")
    assert (check.status, check.size, check.expected_size) == (SqshStatus.DEVICES, 4096, 4000)
    assert (check.device_count, check.devices) == (8, ("/dev/console", "/dev/my null", "/dev/zero"))
    assert not check.valid
    message = check.describe()
    assert message.startswith("/p.sqsh holds 8 device node(s) (/dev/console, /dev/my null, /dev/zero, ...): ")
    assert "mksquashfs ROOT IMAGE -noappend -ef devices.txt" in message and "-e dev" in message
    one = parse_sqsh_validation("NPA_SQSH_DEVICE /opt/wh\nNPA_SQSH DEVICES 1 1 1\n", "/q.sqsh")
    assert one.describe().startswith("/q.sqsh holds 1 device node(s) (/opt/wh): ")
    with pytest.raises(NpaParseError):
        parse_sqsh_validation("NPA_SQSH DEVICES 4096 4000\n", "/p.sqsh")


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


def _squash(root: Path, image: Path, *extra: str) -> Path:
    subprocess.run(
        ["mksquashfs", str(root), str(image), "-quiet", "-noappend", *extra], check=True, capture_output=True
    )
    return image


def _full_check(path: Path):
    out = subprocess.run(["bash", "-c", build_sqsh_validate_command(str(path))], capture_output=True, text=True)
    return parse_sqsh_validation(out.stdout, str(path))


@needs_squashfs
def test_check_function_finds_the_device_nodes_an_unprivileged_unpack_cannot_create(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "opt" / "2024-01-01 10:00 x").mkdir(parents=True)
    os.mkfifo(root / "fifo")  # a user can create FIFOs (and sockets, symlinks, any mode): those unpack fine
    (root / "etc").mkdir()
    (root / "etc" / "unreadable").write_text("x")
    (root / "etc" / "unreadable").chmod(0)
    assert _full_check(_squash(root, tmp_path / "fine.sqsh")).status is SqshStatus.VALID

    # Pseudo definitions add devices without privileges, as a mksquashfs of a debootstrapped tree holds them.
    devices = ["dev/console c 600 0 0 5 1", "dev/loop0 b 660 0 6 7 0", '"opt/2024-01-01 10:00 x/wh" c 0 0 0 0 0']
    image = _squash(root, tmp_path / "devices.sqsh", *(a for d in devices for a in ("-p", d)))
    check = _full_check(image)
    assert (check.status, check.device_count) == (SqshStatus.DEVICES, 3)
    assert check.devices == ("/dev/console", "/dev/loop0", "/opt/2024-01-01 10:00 x/wh")
    assert check.describe().startswith(f"{image} holds 3 device node(s) (/dev/console, /dev/loop0, /opt/")


@needs_squashfs
@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_the_advice_for_device_nodes_works(tmp_path: Path) -> None:
    """The fix the message gives, run as given: the rebuilt image holds no device, the rest is kept."""
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "opt").mkdir()
    (root / "opt" / "keep").write_text("kept\n")
    os.mknod(root / "dev" / "null", 0o666 | 0o020000, os.makedev(1, 3))
    os.mknod(root / "opt" / "wh", 0o600 | 0o020000, os.makedev(0, 0))
    image = _squash(root, tmp_path / "image.sqsh")
    advice = _full_check(image).describe()
    assert "-all-root keeps them" in advice
    find, mksquashfs = advice.split("Rebuild the image without them: ", 1)[1].split(" (or -e dev", 1)[0].split("; ")
    script = f"cd {tmp_path} && {find} && {mksquashfs}".replace("ROOT", "root").replace("IMAGE", "fixed.sqsh")
    subprocess.run(["bash", "-c", script], check=True, capture_output=True)
    assert _full_check(tmp_path / "fixed.sqsh").status is SqshStatus.VALID
    listing = subprocess.run(["unsquashfs", "-lln", "-d", "", str(tmp_path / "fixed.sqsh")], capture_output=True)
    assert b"/opt/keep" in listing.stdout and b"/dev/null" not in listing.stdout
    only_dev = tmp_path / "only-dev"
    (only_dev / "dev").mkdir(parents=True)
    os.mknod(only_dev / "dev" / "null", 0o666 | 0o020000, os.makedev(1, 3))
    assert _full_check(_squash(only_dev, tmp_path / "e-dev.sqsh", "-e", "dev")).status is SqshStatus.VALID
