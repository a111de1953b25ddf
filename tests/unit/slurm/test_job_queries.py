"""AsyncSlurmHook.aquery_jobs and asubmit_time on scripted answers of the local 22.05 cluster: a job is "absent"
only when sacct and squeue both answered without it; a submit time is Slurm's own record."""

from __future__ import annotations

import shlex

import pytest

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
