"""Builders of npa_airflow.slurm.commands: the exact argv of sbatch, sacct, squeue, scancel and scontrol."""

from __future__ import annotations

import pytest

from npa_airflow.exceptions import NpaValidationError
from npa_airflow.slurm import commands as c

FIELDS = "JobIDRaw,JobID,State,ExitCode,NodeList,Reason,ElapsedRaw,AllocTRES,JobName"  # with the job's usage
FIND_FIELDS = "JobIDRaw,JobID,State,ExitCode,NodeList,Reason,JobName,Submit,Comment"  # no usage: owners only


def test_build_sbatch_submit():
    assert c.build_sbatch_submit("/s/job.sbatch") == ["sbatch", "--parsable", "/s/job.sbatch"]
    assert c.build_sbatch_submit("/s/j", ["--exclude=g1"], cluster="x") == [
        "sbatch", "--parsable", "-M", "x", "--exclude=g1", "/s/j",
    ]  # fmt: skip
    for bad in (["-x g1"], ["--a\n--b"]):
        with pytest.raises(NpaValidationError):
            c.build_sbatch_submit("/s/j", bad)
    with pytest.raises(NpaValidationError):
        c.build_sbatch_submit("relative.sbatch")


def test_build_sacct_states_is_one_command_for_many_jobs():
    assert c.build_sacct_states(["12", "13", "12", "14_2"]) == [
        "sacct", "-X", "--parsable2", "--noheader", "-o", FIELDS, "-j", "12,13,14_2",
    ]  # fmt: skip
    assert c.build_sacct_states(["12"], cluster="west")[4:6] == ["-M", "west"]


@pytest.mark.parametrize("bad", [[], ["12", "13;id"], ["$(reboot)"]])
def test_build_sacct_states_validates(bad):
    with pytest.raises(NpaValidationError):
        c.build_sacct_states(bad)


def test_build_squeue_states():
    assert c.build_squeue_states(["5", "6"]) == [
        "squeue", "-h", "-t", "all", "--jobs=5,6", "-o", "%i|%A|%T|%r|%N|%j",
    ]  # fmt: skip


def test_find_by_name_builders_ask_for_this_user_s_jobs_with_submit_time_and_comment():
    assert c.build_find_by_name_sacct(["npa-a-t1", "npa-a-t2"], "npa") == [
        "env", "SLURM_TIME_FORMAT=%s", "sacct", "-X", "--parsable2", "--noheader",
        "-o", FIND_FIELDS, "-S", "now-7days", "--user=npa", "--name=npa-a-t1,npa-a-t2",
    ]  # fmt: skip
    assert c.build_find_by_name_squeue(["npa-a-t1"], "npa", "b") == [
        "env", "SLURM_TIME_FORMAT=%s", "squeue", "-h", "-t", "all", "-M", "b", "--user=npa", "--name=npa-a-t1",
        "-o", "%i|%A|%T|%r|%N|%j|%V|%k",
    ]  # fmt: skip


@pytest.mark.parametrize("names", [[], ["a,b"], ["a b"], ["$(x)"], [""]])
def test_find_by_name_rejects_unsafe_names(names):
    with pytest.raises(NpaValidationError):
        c.build_find_by_name_squeue(names, "npa")
    with pytest.raises(NpaValidationError):
        c.build_find_by_name_sacct(names, "npa")


@pytest.mark.parametrize("user", ["", "a b", "$(id)", "npa,root", "-a"])
def test_find_by_name_refuses_an_odd_user(user):
    with pytest.raises(NpaValidationError, match="user="):
        c.build_find_by_name_squeue(["a"], user)
    with pytest.raises(NpaValidationError, match="user="):
        c.build_find_by_name_sacct(["a"], user)


def test_find_by_name_sacct_rejects_bad_start():
    with pytest.raises(NpaValidationError, match="start="):
        c.build_find_by_name_sacct(["a"], "npa", start="now; reboot")


def test_build_cancel():
    assert c.build_cancel("42") == ["scancel", "42"]
    assert c.build_cancel("42_1", cluster="west") == ["scancel", "-M", "west", "42_1"]
    with pytest.raises(NpaValidationError):
        c.build_cancel("42 43")
