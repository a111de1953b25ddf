"""AsyncSlurmHook.aquery_jobs and asubmit_time on scripted answers of the local 22.05 cluster: a job is "absent"
only when sacct and squeue both answered without it; a submit time is Slurm's own record."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaRemoteError
from npa_airflow.slurm.connection import SlurmConnectionConfig
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.ssh import CommandResult

CONFIG = SlurmConnectionConfig(conn_id="slurm_x", hosts=(("127.0.0.1", 1),), user="npa")
INVALID_ID = "slurm_load_jobs error: Invalid job id specified\n"
DBD_DOWN = "sacct: error: Problem talking to the database: Connection refused\n"
CTLD_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
RUNNING = "7|7|RUNNING|None|c1|job\n"


def scripted(sacct: tuple[int, str, str], squeue: tuple[int, str, str]) -> SlurmHook:
    hook = SlurmHook(config=CONFIG)

    async def arun(argv, **kwargs):
        command = argv if isinstance(argv, str) else shlex.join(argv)
        rc, out, err = sacct if command.startswith("sacct") else squeue
        return CommandResult(stdout=out.encode(), stderr=err.encode(), returncode=rc, host="login1")

    hook.arun = arun  # type: ignore[method-assign]
    return hook


@pytest.mark.parametrize(
    ("sacct", "squeue", "absent"),
    [
        ((0, "", ""), (1, "", INVALID_ID), {"7"}),  # both answered: not there
        ((1, "", DBD_DOWN), (1, "", INVALID_ID), set()),  # accounting did not answer: ended and purged, maybe
        ((0, "", ""), (1, "", CTLD_DOWN), set()),  # slurmctld did not answer
        ((0, "", ""), (0, RUNNING, ""), set()),  # accounting lags, squeue has it
    ],
)
async def test_a_job_is_absent_only_when_both_tools_answered_without_it(sacct, squeue, absent):
    query = await scripted(sacct, squeue).aquery_jobs(["7"])
    assert query.absent == frozenset(absent)
    assert ("7" in query.states) is (squeue[1] == RUNNING)


async def test_neither_tool_answering_is_an_error_not_an_absence():
    with pytest.raises(NpaRemoteError, match="neither sacct nor squeue answered"):
        await scripted((1, "", DBD_DOWN), (1, "", CTLD_DOWN)).aquery_jobs(["7"])


async def test_submit_time_is_slurms_record():
    hook = scripted((0, "7|1796216400\n", ""), (0, "7|1796216400\n", ""))
    assert await hook.asubmit_time("7") == 1796216400.0
    assert await scripted((0, "", ""), (1, "", INVALID_ID)).asubmit_time("7") is None


def lagging(sacct_out: str, squeue_out: str, asked: list[str]) -> SlurmHook:
    """sacct and squeue answers scripted; the end records line of the sacct command runs for real in bash."""
    hook = SlurmHook(config=CONFIG)

    async def arun(argv, **kwargs):
        command = argv if isinstance(argv, str) else shlex.join(argv)
        asked.append(command)
        if command.startswith("squeue"):
            return CommandResult(stdout=squeue_out.encode(), stderr=b"", returncode=0, host="login1")
        records, _, sacct = command.rpartition("exec ")
        assert sacct.startswith("sacct")
        line = subprocess.run(["bash", "-c", records + "true"], capture_output=True, check=True).stdout
        return CommandResult(stdout=line + sacct_out.encode(), stderr=b"", returncode=0, host="login1")

    hook.arun = arun  # type: ignore[method-assign]
    return hook


async def test_a_job_whose_end_record_exists_while_sacct_says_running_is_settled_by_squeue(tmp_path):
    """Accounting lags under load: sacct still says RUNNING after the job's script wrote its end record."""
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "child_exit_code").write_text("0\n")
    records = {i: str(tmp_path / i / "child_exit_code") for i in ("7", "8", "9")}
    sacct = "7|7|RUNNING|0:0|c1|None|a\n8|8|RUNNING|0:0|c1|None|b\n9|9|RUNNING|0:0|c1|None|c\n"
    asked: list[str] = []
    query = await lagging(sacct, "7|7|COMPLETED|None|c1|a\n", asked).aquery_jobs(["7", "8", "9"], records)
    assert query.states["7"].state is JobState.COMPLETE and query.states["7"].source == "squeue"
    assert [query.states[i].state for i in ("8", "9")] == [JobState.RUNNING, JobState.RUNNING]
    assert query.end_records_checked == {"7"} and query.ended_before_accounting == {"7"}
    assert len(asked) == 2 and "--jobs=7 " in asked[1]  # one sacct, then one squeue for job 7 only


@pytest.mark.parametrize(
    ("squeue", "state"),
    [
        ("7|7|RUNNING|None|c1|a\n", JobState.RUNNING),  # the script is between its last write and its exit
        ("7|7|FAILED|NonZeroExitCode|c1|a\n", JobState.RUNNING),  # exit code and reason come from sacct
        ("", JobState.RUNNING),  # slurmctld no longer knows it: sacct's word stands
    ],
)
async def test_only_a_completed_answer_settles_a_job_early(tmp_path, squeue, state):
    record = tmp_path / "child_exit_code"
    record.write_text("0\n")
    query = await lagging("7|7|RUNNING|0:0|c1|None|a\n", squeue, []).aquery_jobs(["7"], {"7": str(record)})
    assert query.states["7"].state is state and query.end_records_checked == {"7"}
    assert query.ended_before_accounting == frozenset()


async def test_no_end_record_and_no_squeue_in_steady_state(tmp_path):
    asked: list[str] = []
    records = {"7": str(tmp_path / "child_exit_code")}  # not written: the job runs
    query = await lagging("7|7|RUNNING|0:0|c1|None|a\n", "", asked).aquery_jobs(["7"], records)
    assert query.states["7"].state is JobState.RUNNING and query.end_records_checked == frozenset()
    assert len(asked) == 1, "a running job without an end record costs slurmctld nothing"
