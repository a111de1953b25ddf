"""container.py: the mounts, working directory and --container-env names of a containerised step."""

from __future__ import annotations

import shlex

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm.submit.container import (
    check_mountable,
    container_srun_options,
    env_names,
    merge_mounts,
    mount_target,
)


@pytest.mark.parametrize(
    ("mount", "target"),
    [
        ("/a", "/a"),
        ("/a/", "/a"),
        ("/a:/b", "/b"),
        ("/a:/b/:ro", "/b"),
        ("/a:/b:ro+rprivate", "/b"),
    ],
)
def test_mount_target(mount, target):
    assert mount_target(mount) == target


def test_job_paths_are_mounted_at_the_same_path_parents_first():
    assert merge_mounts(["/shared/results/job", "/shared/data/set"], ["/lustre/code:/code:ro"]) == (
        "/lustre/code:/code:ro",  # depth 1: mounted before the deeper job paths
        "/shared/results/job",
        "/shared/data/set",
    )


def test_a_job_path_inside_another_is_not_mounted_twice():
    assert merge_mounts(["/shared/results/job", "/shared/results/job/inputs/x", "/shared/results/job/"], []) == (
        "/shared/results/job",
    )


def test_a_user_mount_of_a_job_path_replaces_the_job_mount_there():
    results = "/shared/results/job"
    assert merge_mounts([results], [f"{results}:{results}:ro"]) == (f"{results}:{results}:ro",)
    assert merge_mounts([results], [results]) == (results,)
    assert merge_mounts([results], ["/elsewhere:/shared/results/job/"]) == ("/elsewhere:/shared/results/job/",)


def test_exact_duplicate_user_mounts_appear_once_and_parents_come_before_children():
    mounts = merge_mounts(["/r/x/y/job"], ["/d:/mnt/a/b", "/d:/mnt/a/b", "/e:/mnt"])
    assert mounts == ("/e:/mnt", "/d:/mnt/a/b", "/r/x/y/job")


def test_a_parent_of_the_results_dir_mounted_by_the_user_comes_first():
    """The example DAG mounts the whole results root: the job's own directory inside it must not be hidden."""
    assert merge_mounts(["/shared/results/job"], ["/shared/results:/shared/results"]) == (
        "/shared/results:/shared/results",
        "/shared/results/job",
    )


@pytest.mark.parametrize("path", ["/a,b", "/a:b", "/a b", "/a\tb", "relative", ""])
def test_paths_pyxis_cannot_mount_are_refused_with_the_reason(path):
    with pytest.raises(NpaValidationError, match=r"cannot be mounted into the container.*','.*':'"):
        check_mountable(path, "results_dir")


def test_env_names_are_unique_and_validated():
    assert env_names(["A", "B_1", "A"]) == ("A", "B_1")
    with pytest.raises(NpaValidationError, match="not an environment variable name"):
        env_names(["OK", "1BAD"])
    with pytest.raises(NpaValidationError):
        env_names(["A,B"])


def test_srun_options_quote_every_path_and_list_the_names():
    options = container_srun_options("/sq/i.sqsh", ["/a b:/c", "/d"], "/w $x", ["A", "B"])
    assert options == [
        "--container-image=/sq/i.sqsh",
        "--container-mounts='/a b:/c',/d",
        "--container-workdir='/w $x'",
        "--container-env=A,B",
    ]
    assert [shlex.split(o)[0] for o in options][2] == "--container-workdir=/w $x"


def test_srun_options_without_mounts_or_names():
    assert container_srun_options("/i.sqsh", [], "/w", []) == ["--container-image=/i.sqsh", "--container-workdir=/w"]
