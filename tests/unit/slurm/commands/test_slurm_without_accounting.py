"""A Slurm site without accounting (no slurmdbd): the pure decisions and the hook's queries, on output recorded from
the bed without accounting (`samples/22.05-noacct`, `dev/cluster --no-accounting`).

There sacct answers "Slurm accounting storage is disabled"; job states come from squeue (ended jobs until
MinJobAge), `scontrol show job` and each job's end record. The hook's commands run for real in local bash, around
`sacct`, `squeue` and `scontrol` scripts on PATH that print recorded answers and log their arguments.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from npa_airflow.common.remote_errors import sacct_accounting_disabled
from npa_airflow.common.states import JobState
from npa_airflow.exceptions import NpaCancelFailed
from npa_airflow.slurm import commands
from npa_airflow.slurm.commands.end_records import split_end_record_codes, with_end_record_codes
from npa_airflow.slurm.commands.without_accounting import gone_without_record, needs_scontrol, settle
from npa_airflow.slurm.submit.preflight import PreflightRequest, build_preflight_command, parse_preflight
from npa_airflow.slurm.transport.cancels import ENDED
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from tests.harness.scripted_slurm_tools import ScriptedSlurmTools

SAMPLES = Path(__file__).parents[1] / "samples" / "22.05-noacct"
CONFIG = SlurmConnectionConfig(conn_id="slurm_noacct", hosts=(("127.0.0.1", 1),), user="npa")
DBD_DOWN = "sacct: error: Problem talking to the database: Connection refused\n"


def framed(name: str) -> tuple[int, str, str]:
    """(rc, stdout, stderr) of a sample recorded as rc=/stdout=/stderr= lines."""
    values = dict(line.split("=", 1) for line in (SAMPLES / name).read_text().splitlines())
    return int(values["rc"]), ast.literal_eval(values["stdout"]), ast.literal_eval(values["stderr"])


SACCT_DISABLED = framed("sacct_states.txt")
SQUEUE = (SAMPLES / "squeue_states.txt").read_text()  # 1 ok, 2 exit 7, 3 killed, 4 cancelled, 5 held, 6 running
SQUEUE_PURGED = (SAMPLES / "squeue_states_purged.txt").read_text()  # 1-4 forgotten after MinJobAge
INVALID_ID = framed("squeue_purged_single.txt")


# -- what the tools said ---------------------------------------------------------------------------------------


def test_sacct_without_accounting_is_told_apart_from_slurmdbd_down():
    rc, out, err = SACCT_DISABLED
    assert rc == 1 and out == "" and sacct_accounting_disabled(err)
    assert sacct_accounting_disabled(framed("sacct_find_by_name.txt")[2])
    assert not sacct_accounting_disabled(DBD_DOWN)
    assert not sacct_accounting_disabled(INVALID_ID[2])


def test_squeue_shows_ended_jobs_until_min_job_age_then_forgets_them():
    live = commands.parse_squeue(SQUEUE)
    assert {i: live[i].native_state for i in live} == {
        "1": "COMPLETED", "2": "FAILED", "3": "FAILED", "4": "CANCELLED", "5": "PENDING", "6": "RUNNING",
    }  # fmt: skip
    assert all(info.exit_code is None for info in live.values()), "squeue has no exit codes"
    assert sorted(commands.parse_squeue(SQUEUE_PURGED)) == ["5", "6"]


@pytest.mark.parametrize(
    ("sample", "native", "exit_code", "signal"),
    [
        ("scontrol_job_failed.txt", "FAILED", 7, 0),
        ("scontrol_job_completed.txt", "COMPLETED", 0, 0),
        ("scontrol_job_cancelled.txt", "CANCELLED", 0, 15),
    ],
)
def test_scontrol_show_job_gives_an_ended_jobs_exit_code(sample, native, exit_code, signal):
    info = commands.parse_scontrol_job((SAMPLES / sample).read_text())
    assert info is not None
    assert (info.native_state, info.exit_code, info.signal, info.source) == (native, exit_code, signal, "scontrol")
    assert info.job_name is not None and info.job_name.startswith("npa-sample-") and info.node_list == "c1"


def test_scontrol_show_job_of_a_forgotten_job_prints_nothing():
    rc, out, err = framed("scontrol_job_purged.txt")
    assert rc == 1 and commands.parse_scontrol_job(out) is None and "Invalid job id" in err


# -- the decisions -----------------------------------------------------------------------------------------------

RECORDS = {i: f"/shared/results/job{i}/child_exit_code" for i in ("1", "2", "3", "4", "5", "6")}


def test_a_live_job_is_what_squeue_says_with_the_exit_code_of_an_ended_one():
    live = commands.parse_squeue(SQUEUE)
    codes = {RECORDS["1"]: 0, RECORDS["2"]: 7}  # 3 was killed and 4 cancelled before their script's last write
    detail = commands.parse_scontrol_job((SAMPLES / "scontrol_job_failed.txt").read_text())
    assert detail is not None
    query = settle(list(RECORDS), live, RECORDS, codes, {"3": detail})
    got = {i: (s.native_state, s.state, s.exit_code) for i, s in query.states.items()}
    assert got == {
        "1": ("COMPLETED", JobState.COMPLETE, 0),
        "2": ("FAILED", JobState.ERROR, 7),  # from the end record
        "3": ("FAILED", JobState.ERROR, 7),  # from scontrol (this detail is the recorded one of a job exiting 7)
        "4": ("CANCELLED", JobState.CANCELED, None),
        "5": ("PENDING", JobState.PENDING, None),
        "6": ("RUNNING", JobState.RUNNING, None),
    }
    assert query.absent == frozenset()


def test_scontrol_is_asked_only_about_failed_jobs_whose_record_holds_no_exit_code():
    live = commands.parse_squeue(SQUEUE)
    assert [i for i in sorted(live) if needs_scontrol(live[i], None)] == ["2", "3"]
    assert not needs_scontrol(live["2"], 7) and not needs_scontrol(None, None)


@pytest.mark.parametrize(
    ("code", "native", "state", "exit_code"),
    [(0, "COMPLETED", JobState.COMPLETE, 0), (3, "FAILED", JobState.ERROR, 3), (143, "FAILED", JobState.ERROR, 143)],
)
def test_a_forgotten_job_is_settled_from_its_end_record(code, native, state, exit_code):
    live = commands.parse_squeue(SQUEUE_PURGED)
    query = settle(["1"], live, RECORDS, {RECORDS["1"]: code})
    info = query.states["1"]
    assert (info.native_state, info.state, info.exit_code, info.source) == (native, state, exit_code, "end_record")


@pytest.mark.parametrize("codes", [{}, {RECORDS["4"]: None}], ids=["no record", "a record without an exit code"])
def test_a_forgotten_job_without_an_end_record_failed_and_says_why_never_a_success(codes):
    query = settle(["4"], commands.parse_squeue(SQUEUE_PURGED), RECORDS, codes)
    info = query.states["4"]
    assert info.state is JobState.ERROR and info.exit_code is None and info.native_state == "UNKNOWN"
    assert info.reason == gone_without_record("4", RECORDS["4"])
    assert "no end record" in info.reason and "keeps no accounting" in info.reason and RECORDS["4"] in info.reason


def test_a_forgotten_job_whose_record_is_not_known_is_absent():
    query = settle(["4", "6"], commands.parse_squeue(SQUEUE_PURGED), {}, {})
    assert query.absent == {"4"} and sorted(query.states) == ["6"]


def test_end_record_codes_are_read_by_the_shell_in_the_state_querys_command(tmp_path):
    (tmp_path / "ok").write_text("0\n")
    (tmp_path / "failed").write_text("3\n")
    (tmp_path / "no-newline").write_text("143")
    (tmp_path / "garbage").write_text("x; rm -rf /\n")
    paths = [str(tmp_path / n) for n in ("ok", "failed", "no-newline", "garbage", "missing")]
    paths.append(str(tmp_path / "it's $(odd)"))
    command = with_end_record_codes(["printf", "%s\\n", "squeue says"], paths)
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout
    codes, rest = split_end_record_codes(out, paths)
    assert codes == {paths[0]: 0, paths[1]: 3, paths[2]: 143, paths[3]: None}
    assert rest == "squeue says\n"


def test_a_damaged_record_line_reads_as_no_record():
    assert split_end_record_codes("0 \nrest", ["/a", "/b"]) == ({"/a": 0}, "rest")


# -- the builders --------------------------------------------------------------------------------------------


def test_without_accounting_cancel_origin_and_submit_time_run_no_sacct():
    origin = commands.build_cancel_origin("4", "/shared/sbatch/x.sbatch.npa-cancelled", accounting=False)
    assert "sacct" not in origin and "squeue -h -t all --jobs=4 -o %T" in origin
    assert "sacct" in commands.build_cancel_origin("4", None)
    assert "sacct" not in commands.build_submit_time("4", accounting=False)
    assert commands.build_scontrol_job("4", "b") == ["scontrol", "-M", "b", "--oneliner", "show", "job", "4"]


def test_who_cancelled_without_accounting_is_told_only_by_airflows_marker():
    origin = commands.parse_cancel_origin("NPA_CANCEL_STATE CANCELLED\n", accounting=False)
    assert not origin.by_airflow and origin.uid is None
    assert "no accounting" in origin.describe() and "CANCELLED" in origin.describe()
    mine = commands.parse_cancel_origin("NPA_CANCEL_BY_AIRFLOW\nNPA_CANCEL_STATE CANCELLED\n", accounting=False)
    assert mine.by_airflow and mine.describe() == "by Airflow"


@pytest.mark.parametrize(
    ("line", "accounting"),
    [
        ("NPA_PF accounting yes", True),
        (f"NPA_PF accounting-error {SACCT_DISABLED[2].strip()}", False),
        (f"NPA_PF accounting-error {DBD_DOWN.strip()}", None),
    ],
)
def test_preflight_reports_whether_the_cluster_keeps_accounting(line, accounting):
    request = PreflightRequest(tools=(), check_pyxis=False, check_enroot=False)
    assert "sacct -X -n -o JobID -S now -E now" in build_preflight_command(request)
    report = parse_preflight(f"{line}\nNPA_PF done\n", request)
    assert report.ok and report.accounting is accounting and report.to_dict()["accounting"] is accounting
    assert ("no accounting" in report.accounting_mode) is (accounting is False)


# -- the hook, around scripted tools --------------------------------------------------------------------------


class Tools(ScriptedSlurmTools):
    """Scripted `sacct`, `squeue` and `scontrol` (tests.harness.scripted_slurm_tools) for the hook of CONFIG."""

    def __init__(self, tmp_path: Path, answers: dict[str, tuple[int, str, str]]) -> None:
        super().__init__(tmp_path, answers, CONFIG)


async def test_the_state_query_learns_once_that_there_is_no_accounting_then_runs_no_sacct(tmp_path):
    (tmp_path / "job2").mkdir()
    (tmp_path / "job2" / "child_exit_code").write_text("7\n")
    records = {i: str(tmp_path / f"job{i}" / "child_exit_code") for i in ("1", "2", "3", "4", "6")}
    failed = (0, (SAMPLES / "scontrol_job_failed.txt").read_text(), "")
    tools = Tools(tmp_path, {"sacct": SACCT_DISABLED, "squeue": (0, SQUEUE, ""), "scontrol": failed})
    hook = tools.hook()
    assert await hook.aaccounting() is None
    first = await hook.aquery_jobs(list(records), end_record_paths=records)
    assert await hook.aaccounting() is False
    second = await hook.aquery_jobs(list(records), end_record_paths=records)
    assert first == second
    assert len(tools.calls("sacct")) == 1, "sacct ran once, to learn"
    assert tools.calls("scontrol") == ["--oneliner show job 3"] * 2, "only the failed job without an exit code"
    assert [first.states[i].exit_code for i in ("1", "2", "3")] == [0, 7, 7]
    assert first.states["4"].state is JobState.CANCELED and first.states["6"].state is JobState.RUNNING
    # no accounting, no usage: the query says so, and no job's is made up
    assert not first.accounting and {info.usage for info in first.states.values()} == {None}
    # the sacct that taught it, then per query: squeue with the records in one round trip, then scontrol's
    assert len(tools.round_trips) == 1 + 2 * 2


async def test_a_job_slurmctld_forgot_is_settled_from_its_end_record_by_the_hook(tmp_path):
    (tmp_path / "job1").mkdir()
    (tmp_path / "job1" / "child_exit_code").write_text("0\n")
    records = {i: str(tmp_path / f"job{i}" / "child_exit_code") for i in ("1", "4")}
    tools = Tools(tmp_path, {"sacct": SACCT_DISABLED, "squeue": (0, SQUEUE_PURGED, "")})
    query = await tools.hook().aquery_jobs(["1", "4", "6"], end_record_paths=records)
    assert query.states["1"].state is JobState.COMPLETE and query.states["1"].source == "end_record"
    assert query.states["1"].usage is None and not query.accounting
    assert query.states["4"].state is JobState.ERROR and "no end record" in (query.states["4"].reason or "")
    assert query.states["6"].state is JobState.RUNNING and query.absent == frozenset()


async def test_squeue_of_one_forgotten_job_is_an_answer(tmp_path):
    tools = Tools(tmp_path, {"sacct": SACCT_DISABLED, "squeue": INVALID_ID})
    query = await tools.hook().aquery_jobs(["1"])
    assert query.states == {} and query.absent == {"1"}


async def test_slurmdbd_down_is_not_taken_for_a_site_without_accounting(tmp_path):
    tools = Tools(tmp_path, {"sacct": (1, "", DBD_DOWN), "squeue": (0, SQUEUE, "")})
    hook = tools.hook()
    await hook.aquery_jobs(["6"], pending=["6"])
    await hook.aquery_jobs(["6"], pending=["6"])
    assert await hook.aaccounting() is None and len(tools.calls("sacct")) == 2


async def test_find_by_name_without_accounting_reads_squeue_only_once_learnt(tmp_path):
    found = "6|6|RUNNING|None|c1|npa-sample-running|1796216400|npa1:x:y\n"
    tools = Tools(tmp_path, {"sacct": SACCT_DISABLED, "squeue": (0, found, "")})
    hook = tools.hook()
    for _ in range(2):
        jobs = await hook.afind_jobs_by_name(["npa-sample-running"])
        assert [(j.job_id, j.comment) for j in jobs] == [("6", "npa1:x:y")]
    assert len(tools.calls("sacct")) == 1 and len(tools.calls("squeue")) == 2


async def test_a_cancel_without_accounting_is_checked_by_squeue_and_the_end_record(tmp_path):
    """scancel of a job slurmctld has forgotten: ENDED when its end record exists, refused when it left none."""
    (tmp_path / "job1").mkdir()
    (tmp_path / "job1" / "child_exit_code").write_text("0\n")
    scancel = tmp_path / "tools" / "bin" / "scancel"
    tools = Tools(tmp_path, {"sacct": SACCT_DISABLED, "squeue": INVALID_ID})
    scancel.write_text("#!/bin/bash\nexit 0\n")  # 22.05: silent for an id it does not know
    scancel.chmod(0o755)
    hook = tools.hook()
    record = str(tmp_path / "job1" / "child_exit_code")
    assert await hook.acancel("1", end_record=record) == ENDED
    with pytest.raises(NpaCancelFailed, match=r"keeps no accounting.*no end record"):
        await hook.acancel("4", end_record=str(tmp_path / "job4" / "child_exit_code"))
    assert await hook.acancel("1", job_name="npa-sample-ok", end_record=record) == ENDED
    assert len(tools.calls("sacct")) == 1, "learnt at the first cancel, then never again"


async def test_who_cancelled_without_accounting_asks_squeue(tmp_path):
    """The first answer (sacct's, with why it printed no state) teaches the hook; then squeue is asked, and from
    then on only squeue."""
    tools = Tools(tmp_path, {"sacct": SACCT_DISABLED, "squeue": (0, "CANCELLED\n", "")})
    marker = tmp_path / "job.sbatch.npa-cancelled"
    hook = tools.hook()
    origin = await hook.acancel_origin("4", str(marker))
    assert origin.state == "CANCELLED" and not origin.by_airflow and not origin.accounting
    assert await hook.aaccounting() is False and len(tools.round_trips) == 2
    marker.write_text("")
    assert (await hook.acancel_origin("4", str(marker))).by_airflow
    assert len(tools.round_trips) == 3 and "sacct" not in tools.round_trips[-1]


async def test_who_cancelled_with_accounting_costs_one_round_trip(tmp_path):
    tools = Tools(tmp_path, {"sacct": (0, "CANCELLED by 0\n", "")})
    origin = await tools.hook().acancel_origin("4", None)
    assert (origin.uid, origin.accounting, origin.sacct_error) == ("0", True, None)
    assert len(tools.round_trips) == 1


async def test_the_poller_gives_the_state_query_every_jobs_end_record_whatever_its_last_state():
    """Only the hook knows whether the cluster keeps accounting: the poller hands it every end record it knows
    (`end_record_paths`), besides those of not-ended jobs it watches while accounting lags (`end_records`), which
    an unconfirmed ask takes out for a while."""
    from npa_airflow.slurm.watch.poller import SlurmPoller

    class Hook:
        def __init__(self) -> None:
            self.calls: list[dict] = []

        async def aquery_jobs(self, job_ids, **kwargs):
            self.calls.append({"ids": list(job_ids), **kwargs})
            return commands.JobQuery({})

    hook = Hook()
    poller = SlurmPoller("slurm_noacct", lambda _: hook, autostart=False)
    watched = poller.register("1", end_record="/r/1/child_exit_code")
    poller.register("2")  # a sensor's bare job id: no results directory, no end record
    await poller.cycle()
    (call,) = hook.calls
    assert call["end_record_paths"] == {"1": "/r/1/child_exit_code"}
    assert call["end_records"] == {"1": "/r/1/child_exit_code"}
    watched.end_next_ask = float("inf")  # an unconfirmed ask being waited out
    await poller.cycle()
    assert hook.calls[1]["end_records"] == {}
    assert hook.calls[1]["end_record_paths"] == {"1": "/r/1/child_exit_code"}
