"""AsyncSlurmHook.aquery_jobs and asubmit_time against scripted sacct and squeue answers recorded on the local
22.05 and 24.11 clusters: a job is "absent" only when the tools asked about it answered without it; a pending job's
reason is slurmctld's, asked in the same round trip as the sacct; a submit time is Slurm's own record.

The hook's commands run for real in local bash (batches, end-record lines, the --only-job-state check), around
`sacct` and `squeue` scripts on PATH that print the scripted answers and log their arguments.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaRemoteError
from npa_airflow.slurm import commands
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from tests.harness.scripted_slurm_tools import HELP_2205, HELP_2411, ScriptedSlurmTools

CONFIG = SlurmConnectionConfig(conn_id="slurm_x", hosts=(("127.0.0.1", 1),), user="npa")
INVALID_ID = "slurm_load_jobs error: Invalid job id specified\n"
DBD_DOWN = "sacct: error: Problem talking to the database: Connection refused\n"
CTLD_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
RUNNING = "7|7|RUNNING|None|c1|job\n"


class Tools(ScriptedSlurmTools):
    """Scripted `sacct` and `squeue` (tests.harness.scripted_slurm_tools) for the hook of CONFIG."""

    def __init__(
        self,
        tmp_path: Path,
        sacct: tuple[int, str, str] = (0, "", ""),
        squeue: tuple[int, str, str] = (0, "", ""),
        help_text: str = HELP_2205,
    ) -> None:
        super().__init__(tmp_path, {"sacct": sacct, "squeue": squeue}, CONFIG, help_text)


@pytest.mark.parametrize(
    ("sacct", "squeue", "absent"),
    [
        ((0, "", ""), (1, "", INVALID_ID), {"7"}),  # both answered: not there
        ((1, "", DBD_DOWN), (1, "", INVALID_ID), set()),  # accounting did not answer: ended and purged, maybe
        ((0, "", ""), (1, "", CTLD_DOWN), set()),  # slurmctld did not answer
        ((0, "", ""), (0, RUNNING, ""), set()),  # accounting lags, squeue has it
    ],
)
@pytest.mark.parametrize("pending", [(), ("7",)], ids=["after-sacct", "with-sacct"])
async def test_a_job_is_absent_only_when_both_tools_answered_without_it(tmp_path, sacct, squeue, absent, pending):
    query = await Tools(tmp_path, sacct, squeue).hook().aquery_jobs(["7"], pending=pending)
    assert query.absent == frozenset(absent)
    assert ("7" in query.states) is (squeue[1] == RUNNING)


@pytest.mark.parametrize("pending", [(), ("7",)], ids=["after-sacct", "with-sacct"])
async def test_neither_tool_answering_is_an_error_not_an_absence(tmp_path, pending):
    tools = Tools(tmp_path, (1, "", DBD_DOWN), (1, "", CTLD_DOWN))
    with pytest.raises(NpaRemoteError, match="neither sacct nor squeue answered"):
        await tools.hook().aquery_jobs(["7"], pending=pending)


# As the 24.11 bed answers: sacct has no pending reason, squeue has it.
SACCT_2411 = (
    "6|6|PENDING|0:0|None assigned|None|0||wrap\n5|5|PENDING|0:0|None assigned|None|0||wrap\n"
    "7|7|RUNNING|0:0|c1|None|5|cpu=1,node=1|wrap\n"
)
SQUEUE_2411 = "6|6|PENDING|DependencyNeverSatisfied||wrap\n5|5|PENDING|JobHeldUser||wrap\n"


async def test_a_pending_jobs_reason_comes_from_squeue_in_the_same_round_trip(tmp_path):
    tools = Tools(tmp_path, (0, SACCT_2411, ""), (0, SQUEUE_2411, ""))
    query = await tools.hook().aquery_jobs(["5", "6", "7"], pending=["5", "6"])
    assert {i: (s.state, s.reason) for i, s in query.states.items()} == {
        "5": (JobState.PENDING, "JobHeldUser"),
        "6": (JobState.PENDING, "DependencyNeverSatisfied"),
        "7": (JobState.RUNNING, None),
    }
    assert len(tools.round_trips) == 1, "the squeue rides with the sacct"
    assert tools.calls("squeue") == ["-h -t all --jobs=5,6 -o %i|%A|%T|%r|%N|%j"], "only the pending jobs"


async def test_a_running_job_costs_slurmctld_nothing(tmp_path):
    tools = Tools(tmp_path, (0, SACCT_2411, ""), (0, SQUEUE_2411, ""))
    query = await tools.hook().aquery_jobs(["7"], pending=[])
    assert query.states["7"].state is JobState.RUNNING
    assert tools.calls("squeue") == [] and len(tools.round_trips) == 1


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        ("6|6|RUNNING|None|c2|wrap\n", (JobState.RUNNING, "RUNNING", "c2")),  # slurmctld leads accounting
        ("6|6|FAILED|NonZeroExitCode|c2|wrap\n", (JobState.PENDING, "PENDING", None)),  # exit code: sacct's, later
        ("", (JobState.PENDING, "PENDING", None)),  # squeue no longer shows it: sacct's word stands
    ],
)
async def test_squeue_corrects_a_pending_job_only_while_it_is_queued_or_running(tmp_path, live, expected):
    tools = Tools(tmp_path, (0, SACCT_2411, ""), (0, live, ""))
    info = (await tools.hook().aquery_jobs(["6"], pending=["6"])).states["6"]
    assert (info.state, info.native_state, info.node_list) == expected


async def test_a_job_squeue_answers_for_keeps_saccts_usage_only_when_both_say_the_same_state(tmp_path):
    """The Compute page asks squeue about every job it shows: a running job's GPU-hours (sacct's AllocTRES and
    ElapsedRaw) survive squeue's answer; a job that started between the two tools has none (sacct saw it pend)."""
    sacct = SACCT_2411.replace("cpu=1,node=1", "cpu=1,gres/gpu=8,node=1")
    squeue = "7|7|RUNNING|None|c1|wrap\n6|6|RUNNING|None|c2|wrap\n5|5|PENDING|JobHeldUser||wrap\n"
    query = (
        await Tools(tmp_path, (0, sacct, ""), (0, squeue, ""))
        .hook()
        .aquery_jobs(["5", "6", "7"], pending=["5", "6", "7"])
    )
    assert query.states["7"].source == "squeue"
    assert query.states["7"].usage == commands.JobUsage(gpus=8, nodes=1, elapsed_seconds=5)
    assert query.states["6"].state is JobState.RUNNING and query.states["6"].usage is None
    assert query.states["5"].usage == commands.JobUsage(gpus=0, nodes=0, elapsed_seconds=0)


async def test_a_pending_job_keeps_saccts_state_when_slurmctld_does_not_answer(tmp_path):
    tools = Tools(tmp_path, (0, SACCT_2411, ""), (1, "", CTLD_DOWN))
    query = await tools.hook().aquery_jobs(["6"], pending=["6"])
    assert query.states["6"].state is JobState.PENDING and query.states["6"].reason is None
    assert query.absent == frozenset()


async def test_a_job_sacct_does_not_know_yet_is_settled_by_the_same_round_trip(tmp_path):
    """Just submitted (not seen yet): accounting lags, slurmctld has it; no second squeue."""
    tools = Tools(tmp_path, (0, "", ""), (0, SQUEUE_2411, ""))
    query = await tools.hook().aquery_jobs(["5"], pending=["5"])
    assert (query.states["5"].reason, query.states["5"].source) == ("JobHeldUser", "squeue")
    assert len(tools.round_trips) == 1 and len(tools.calls("squeue")) == 1


@pytest.mark.parametrize(
    ("help_text", "cluster", "form"),
    [
        (HELP_2411, None, "--only-job-state"),
        (HELP_2205, None, "full"),
        (HELP_2411, "b", "full"),  # 24.11.5 ignores -M with --only-job-state: never together
    ],
)
async def test_a_pure_state_check_uses_only_job_state_where_squeue_has_it(tmp_path, help_text, cluster, form):
    """A job sacct does not know that was not pending (accounting down while it runs): squeue for its state only.
    Whether squeue has --only-job-state is learnt by the first such command on a connection, then sent as is."""
    tools = Tools(tmp_path, (1, "", DBD_DOWN), (0, RUNNING, ""), help_text=help_text)
    hook = tools.hook(cluster)
    for _ in range(2):
        assert (await hook.aquery_jobs(["7"])).states["7"].state is JobState.RUNNING
    calls = tools.calls("squeue")
    assert len(calls) == 2 and len(tools.round_trips) == 4
    assert all(("--only-job-state" in c) is (form != "full") for c in calls)
    assert ("-M b" in calls[0]) is (cluster is not None)
    # The check (squeue --help) rides in the first command only, and not at all with a cluster named.
    checks = ["--help" in trip for trip in tools.round_trips if "squeue" in trip]
    assert checks == ([True, False] if cluster is None else [False, False])


async def test_submit_time_is_slurms_record(tmp_path):
    hook = Tools(tmp_path, (0, "7|1796216400\n", ""), (0, "7|1796216400\n", "")).hook()
    assert await hook.asubmit_time("7") == 1796216400.0
    assert await Tools(tmp_path / "b", (0, "", ""), (1, "", INVALID_ID)).hook().asubmit_time("7") is None


async def test_a_job_whose_end_record_exists_while_sacct_says_running_is_settled_by_squeue(tmp_path):
    """Accounting lags under load: sacct still says RUNNING after the job's script wrote its end record."""
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "child_exit_code").write_text("0\n")
    records = {i: str(tmp_path / i / "child_exit_code") for i in ("7", "8", "9")}
    sacct = "".join(
        f"{i}|{i}|RUNNING|0:0|c1|None|5|cpu=1,node=1|{n}\n" for i, n in (("7", "a"), ("8", "b"), ("9", "c"))
    )
    tools = Tools(tmp_path, (0, sacct, ""), (0, "7|7|COMPLETED|None|c1|a\n", ""))
    query = await tools.hook().aquery_jobs(["7", "8", "9"], records)
    assert query.states["7"].state is JobState.COMPLETE and query.states["7"].source == "squeue"
    # squeue tells no usage: the job keeps its RUNNING record's (elapsed counted to that sacct)
    assert query.states["7"].usage == commands.JobUsage(gpus=0, nodes=1, elapsed_seconds=5) and query.accounting
    assert [query.states[i].state for i in ("8", "9")] == [JobState.RUNNING, JobState.RUNNING]
    assert query.end_records_checked == {"7"} and query.ended_before_accounting == {"7"}
    assert len(tools.round_trips) == 2 and tools.calls("squeue") == ["-h -t all --jobs=7 -o %i|%A|%T|%r|%N|%j"]


async def test_a_job_accounting_still_calls_pending_is_settled_by_squeue_once_its_end_record_exists(tmp_path):
    """slurmdbd stalled before it recorded the job's start (as after a slurmctld restart): sacct says PENDING to
    the end, whether the poller last saw the job pending (its squeue rides with the sacct) or running."""
    record = tmp_path / "child_exit_code"
    record.write_text("0\n")
    for n, pending in enumerate((["7"], [])):
        answers = ((0, "7|7|PENDING|0:0|None assigned|None|0||a\n", ""), (0, "7|7|COMPLETED|None|c1|a\n", ""))
        tools = Tools(tmp_path / str(n), *answers)
        query = await tools.hook().aquery_jobs(["7"], {"7": str(record)}, pending=pending)
        assert query.states["7"].state is JobState.COMPLETE, pending
        assert query.states["7"].usage is None  # accounting never recorded the start: unknown, not zero
        assert query.end_records_checked == {"7"} and query.ended_before_accounting == {"7"}
        assert len(tools.round_trips) == (1 if pending else 2)


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
    tools = Tools(tmp_path, (0, "7|7|RUNNING|0:0|c1|None|5|cpu=1,node=1|a\n", ""), (0, squeue, ""))
    query = await tools.hook().aquery_jobs(["7"], {"7": str(record)})
    assert query.states["7"].state is state and query.end_records_checked == {"7"}
    assert query.ended_before_accounting == frozenset()


async def test_no_end_record_and_no_squeue_in_steady_state(tmp_path):
    records = {"7": str(tmp_path / "child_exit_code")}  # not written: the job runs
    tools = Tools(tmp_path, (0, "7|7|RUNNING|0:0|c1|None|5|cpu=1,node=1|a\n", ""))
    query = await tools.hook().aquery_jobs(["7"], records)
    assert query.states["7"].state is JobState.RUNNING and query.end_records_checked == frozenset()
    assert len(tools.round_trips) == 1 and tools.calls("squeue") == [], "a running job costs slurmctld nothing"


async def test_each_jobs_usage_rides_in_the_state_querys_one_sacct(tmp_path):
    """AllocTRES and ElapsedRaw are fields of the sacct the poller runs anyway: no round trip of their own."""
    sacct = "5|5|COMPLETED|0:0|g[1-2]|None|480|billing=2,cpu=2,gres/gpu=16,mem=8G,node=2|train\n"
    tools = Tools(tmp_path, (0, sacct, ""))
    query = await tools.hook().aquery_jobs(["5"])
    assert query.states["5"].usage == commands.JobUsage(gpus=16, nodes=2, elapsed_seconds=480)
    assert len(tools.round_trips) == 1 and tools.calls("squeue") == []
    (call,) = tools.calls("sacct")
    assert "-o JobIDRaw,JobID,State,ExitCode,NodeList,Reason,ElapsedRaw,AllocTRES,JobName -j 5" in call
