"""Checked cancels (npa_airflow.slurm.transport.cancels): a cancel is reported only when it happened, the cancel
marker is written before scancel, and a cancel by name can only ever reach this try's job. Slurm's answers are scripted
here from what the local 22.05 cluster prints (tests/unit/slurm/samples/22.05); tests/reliability runs them for real."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from npa_airflow.exceptions import NpaCancelFailed, NpaRemoteError, NpaValidationError
from npa_airflow.slurm import commands
from npa_airflow.slurm.handle import SlurmJobHandle
from npa_airflow.slurm.hook import SlurmHook
from npa_airflow.slurm.submit.staging import StagedFile, build_stage, build_submit
from npa_airflow.slurm.transport.cancels import CancelRequest, cancel_marker_of
from npa_airflow.slurm.transport.connection import SlurmConnectionConfig
from npa_airflow.slurm.transport.ssh import CommandResult

CONFIG = SlurmConnectionConfig(conn_id="slurm_x", hosts=(("127.0.0.1", 1),), user="npa")
INVALID_ID = "slurm_load_jobs error: Invalid job id specified\n"  # squeue of one id slurmctld does not know


def scripted(answers: dict[str, tuple[int | None, str, str]]) -> tuple[SlurmHook, list[str]]:
    """A hook whose commands answer by their first word (scancel, squeue, sacct): (rc, stdout, stderr)."""
    hook = SlurmHook(config=CONFIG)
    sent: list[str] = []

    async def arun(argv, **kwargs):
        command = argv if isinstance(argv, str) else shlex.join(argv)
        sent.append(command)
        tool = next((word for word in ("scancel", "squeue", "sacct") if word in command), "other")
        rc, out, err = answers.get(tool, (0, "", ""))  # other: a shred of an ended job's files
        return CommandResult(stdout=out.encode(), stderr=err.encode(), returncode=rc, host="login1")

    hook.arun = arun  # type: ignore[method-assign]
    return hook, sent


async def test_a_job_slurmctld_knows_is_cancelled():
    hook, sent = scripted({"scancel": (0, "", ""), "squeue": (0, "7|7|CANCELLED|None|c1|job\n", "")})
    assert await hook.acancel("7", marker="/r/sbatch/job.sbatch.npa-cancelled") == "cancelled"
    assert sent[0].startswith("{ mkdir -p -- /r/sbatch && : > /r/sbatch/job.sbatch.npa-cancelled; }")
    assert sent[0].endswith("; scancel 7")  # the marker first: whoever sees CANCELLED finds it


async def test_a_job_that_already_ended_is_reported_as_ended():
    hook, _ = scripted({"scancel": (0, "", ""), "squeue": (0, "7|7|COMPLETED|None|c1|job\n", "")})
    assert await hook.acancel("7") == "ended"


async def test_a_purged_job_counts_only_when_accounting_shows_it_finished():
    finished = "7|7|COMPLETED|0:0|c1|None|5|cpu=1,node=1|job\n"
    hook, _ = scripted({"scancel": (0, "", ""), "squeue": (1, "", INVALID_ID), "sacct": (0, finished, "")})
    assert await hook.acancel("7") == "ended"


@pytest.mark.parametrize(
    ("sacct", "says"),
    [("", "has no record of it"), ("7|7|RUNNING|0:0|c1|None|5|cpu=1,node=1|job\n", "still shows it RUNNING")],
)
async def test_silent_scancel_of_a_job_slurmctld_does_not_know_is_no_cancel(sacct, says):
    """Slurm 22.05: `scancel <unknown id>` exits 0 without a word (samples/scancel_invalid.txt)."""
    hook, _ = scripted({"scancel": (0, "", ""), "squeue": (1, "", INVALID_ID), "sacct": (0, sacct, "")})
    with pytest.raises(NpaCancelFailed, match=f"nothing was cancelled: .* does not know Slurm job 7 .*{says}"):
        await hook.acancel("7")


async def test_invalid_job_id_from_other_versions_is_checked_the_same_way():
    error = "scancel: error: Kill job error on job id 7: Invalid job id specified\n"
    hook, _ = scripted({"scancel": (1, "", error), "squeue": (1, "", INVALID_ID), "sacct": (0, "", "")})
    with pytest.raises(NpaCancelFailed, match="nothing was cancelled"):
        await hook.acancel("7")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("scancel: error: Kill job error on job id 7: Access/permission denied\n", NpaCancelFailed),
        ("scancel: error: Unable to contact slurm controller (connect failure)\n", NpaRemoteError),
    ],
)
async def test_a_refused_scancel_is_final_and_an_unanswered_one_is_worth_retrying(error, kind):
    hook, _ = scripted({"scancel": (1, "", error)})
    with pytest.raises(kind) as err:
        await hook.acancel("7")
    assert type(err.value) is kind


async def test_an_unanswered_check_after_scancel_is_worth_retrying():
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
    hook, _ = scripted({"scancel": (0, "", ""), "squeue": (1, "", down)})
    with pytest.raises(NpaRemoteError):
        await hook.acancel("7")


# -- many jobs at once (a DAG run of waiting tasks marked failed: on_kill batches them, kill_batch.py) ---------


def answering(answer) -> tuple[SlurmHook, list[str]]:
    """A hook whose commands are answered by `answer(command) -> (rc, stdout, stderr)`."""
    hook = SlurmHook(config=CONFIG)
    sent: list[str] = []

    async def arun(argv, **kwargs):
        command = argv if isinstance(argv, str) else shlex.join(argv)
        sent.append(command)
        rc, out, err = answer(command)
        return CommandResult(stdout=out.encode(), stderr=err.encode(), returncode=rc, host="login1")

    hook.arun = arun  # type: ignore[method-assign]
    return hook, sent


def requests_for(*ids: str) -> list[CancelRequest]:
    return [
        CancelRequest(i, f"/r/sbatch/j{i}.sbatch.npa-cancelled", (f"/r/sbatch/j{i}.sbatch.npa-secrets",)) for i in ids
    ]


async def test_many_jobs_take_one_scancel_with_every_marker_first_and_one_squeue():
    squeue = "7|7|CANCELLED|None|c1|a\n8|8|COMPLETED|None|c1|b\n"

    def answer(command):
        return (0, squeue, "") if command.startswith("squeue") else (0, "", "")

    hook, sent = answering(answer)
    requests = requests_for("7", "8")
    assert await hook.acancel_many(requests) == {requests[0]: "cancelled", requests[1]: "ended"}
    assert len(sent) == 2
    cancel = sent[0]
    assert cancel.index("j7.sbatch.npa-cancelled") < cancel.index("scancel 7 8")
    assert cancel.index("j8.sbatch.npa-cancelled") < cancel.index("scancel 7 8")
    assert cancel.index("scancel 7 8 || exit $?") < cancel.index("j7.sbatch.npa-secrets")
    assert sent[1].startswith("squeue") and "--jobs=7,8" in sent[1]


async def test_jobs_slurmctld_forgot_are_checked_in_one_sacct_and_only_they_fail():
    def answer(command):
        if command.startswith("squeue"):
            return 0, "7|7|CANCELLED|None|c1|a\n", ""
        if command.startswith("sacct"):
            return 0, "8|8|COMPLETED|0:0|c1|None|5|cpu=1,node=1|b\n", ""
        return 0, "", ""

    hook, sent = answering(answer)
    requests = requests_for("7", "8", "9")
    outcomes = await hook.acancel_many(requests)
    assert outcomes[requests[0]] == "cancelled" and outcomes[requests[1]] == "ended"
    assert isinstance(outcomes[requests[2]], NpaCancelFailed) and "job 9" in str(outcomes[requests[2]])
    assert [c.split()[0] for c in sent[1:]] == ["squeue", "sacct"] and "-j 8,9" in sent[2]


async def test_a_refusal_in_a_batch_is_told_apart_job_by_job():
    denied = "scancel: error: Kill job error on job id 8: Access/permission denied\n"

    def answer(command):
        if "scancel" in command:
            return (1, "", denied) if " 8" in command.split("scancel", 1)[1] else (0, "", "")
        return 0, "7|7|CANCELLED|None|c1|a\n", ""

    hook, sent = answering(answer)
    requests = requests_for("7", "8")
    outcomes = await hook.acancel_many(requests)
    assert outcomes[requests[0]] == "cancelled"
    assert isinstance(outcomes[requests[1]], NpaCancelFailed) and "permission denied" in str(outcomes[requests[1]])
    assert sum("scancel" in c for c in sent) == 3  # the batch, then 7 alone, then 8 alone


async def test_a_refusal_among_nothing_to_cancel_lines_is_not_taken_for_a_cancel():
    mixed = (
        "scancel: error: Kill job error on job id 7: Job/step already completing or completed\n"
        "scancel: error: Kill job error on job id 8: Access/permission denied\n"
    )

    def answer(command):
        if "scancel 7 8" in command:
            return 1, "", mixed
        if "scancel" in command:  # one by one: 7 had nothing to cancel, 8 is refused
            return (1, "", mixed.splitlines()[0]) if "scancel 7" in command else (1, "", mixed.splitlines()[1])
        return 0, "7|7|COMPLETED|None|c1|a\n8|8|PENDING|None|c1|b\n", ""

    hook, _ = answering(answer)
    requests = requests_for("7", "8")
    outcomes = await hook.acancel_many(requests)
    assert outcomes[requests[0]] == "ended" and isinstance(outcomes[requests[1]], NpaCancelFailed)


async def test_an_unanswered_batch_raises_for_all_so_that_each_retries():
    down = "scancel: error: Unable to contact slurm controller (connect failure)\n"
    hook, sent = answering(lambda command: (1, "", down))
    with pytest.raises(NpaRemoteError):
        await hook.acancel_many(requests_for("7", "8"))
    assert len(sent) == 1


async def test_a_batch_that_found_nothing_to_cancel_shreds_once_the_jobs_are_known_ended(monkeypatch):
    error = "scancel: error: Kill job error on job id 7: Invalid job id specified\n"

    def answer(command):
        if "scancel" in command:
            return 1, "", error
        if command.startswith("squeue"):
            return 1, "", INVALID_ID
        return 0, "7|7|COMPLETED|0:0|c1|None|5|cpu=1,node=1|a\n8|8|COMPLETED|0:0|c1|None|5|cpu=1,node=1|b\n", ""

    hook, _ = answering(answer)
    shredded: list[str] = []

    async def ashred(paths):
        shredded.extend(paths)

    monkeypatch.setattr(hook, "ashred", ashred)
    requests = requests_for("7", "8")
    assert await hook.acancel_many(requests) == {requests[0]: "ended", requests[1]: "ended"}
    assert shredded == ["/r/sbatch/j7.sbatch.npa-secrets", "/r/sbatch/j8.sbatch.npa-secrets"]


COMMENT = "npa1:0190f0d2-7a3b-7c41-9e5f-1a2b3c4d5e6f:0123456789abcdef01234567"


async def test_cancel_by_name_asks_for_this_user_s_jobs_of_exactly_this_name():
    hook, sent = scripted({"scancel": (0, "", "")})
    await hook.acancel_by_name(
        "npa-train-0123456789-t2", comment=COMMENT, marker="/r/sbatch/npa-train-0123456789-t2.sbatch.npa-cancelled"
    )
    assert sent[0].startswith("{ mkdir -p -- /r/sbatch && : > /r/sbatch/npa-train-0123456789-t2.sbatch.npa-cancelled")
    assert "squeue -h --user=npa --name=npa-train-0123456789-t2 -o '%A|%k'" in sent[0]


def _fake_tools(tmp_path, squeue_out: str, squeue_rc: int = 0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    (bin_dir / "squeue").write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(squeue_out)}\nexit {squeue_rc}\n")
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "scancel $*" >> {calls}\n')
    for tool in ("squeue", "scancel"):
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}, calls


def test_cancel_by_name_cancels_only_the_jobs_that_carry_this_try_s_proof(tmp_path):
    """Two jobs of this account hold the name (another deployment's, a hand-made one): only the one whose comment is
    this try's proof is cancelled. Run in real bash against stand-in tools."""
    foreign = COMMENT[:-1] + "8"
    listing = f"41|{foreign}\n42|{COMMENT}\n43|\n44|{COMMENT} and more\n"
    env, calls = _fake_tools(tmp_path, listing)
    command = commands.build_cancel_by_name("npa-x-t1", "npa", COMMENT)
    assert subprocess.run(["bash", "-c", command], env=env).returncode == 0
    assert calls.read_text().splitlines() == ["scancel 42"]


def test_cancel_by_name_with_no_such_job_cancels_nothing_and_a_failed_listing_fails(tmp_path):
    env, calls = _fake_tools(tmp_path, "")
    command = commands.build_cancel_by_name("npa-x-t1", "npa", COMMENT)
    assert subprocess.run(["bash", "-c", command], env=env).returncode == 0
    assert not calls.exists()
    env, calls = _fake_tools(tmp_path, "", squeue_rc=1)  # slurmctld did not answer: not "nothing to cancel"
    assert subprocess.run(["bash", "-c", command], env=env).returncode == 1
    assert not calls.exists()


@pytest.mark.parametrize("name", ["npa-*", "a,b", "x y", ""])
def test_cancel_by_name_refuses_a_pattern_or_a_list(name):
    with pytest.raises(NpaValidationError):
        commands.build_cancel_by_name(name, "npa", COMMENT)


@pytest.mark.parametrize("user", ["", "a b", "$(id)", "npa,root"])
def test_cancel_by_name_refuses_an_odd_user(user):
    with pytest.raises(NpaValidationError):
        commands.build_cancel_by_name("npa-x-t1", user, COMMENT)


@pytest.mark.parametrize("comment", ["", "a b", "$(id)", "x'y", "a|b"])
def test_cancel_by_name_refuses_an_odd_comment(comment):
    with pytest.raises(NpaValidationError, match="comment"):
        commands.build_cancel_by_name("npa-x-t1", "npa", comment)


def test_cancel_origin_reads_the_marker_the_uid_and_its_user(tmp_path):
    marker = tmp_path / "job.sbatch.npa-cancelled"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'CANCELLED by 0'\n")
    (bin_dir / "sacct").chmod(0o755)
    command = commands.build_cancel_origin("7", str(marker))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    outside = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env).stdout
    assert commands.parse_cancel_origin(outside).describe() == "outside Airflow by uid 0 (root)"
    marker.touch()
    by_airflow = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env).stdout
    assert commands.parse_cancel_origin(by_airflow).by_airflow


def test_the_marker_test_runs_its_command_only_when_the_marker_exists(tmp_path):
    marker = tmp_path / "odd dir" / "job.sbatch.npa-cancelled"
    command = commands.build_if_cancel_marker(str(marker), "echo seen")
    assert shlex.quote(str(marker)) in command  # a path with a space stays one word
    absent = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert (absent.returncode, absent.stdout) == (0, "")
    marker.parent.mkdir()
    subprocess.run(["bash", "-c", commands.build_record_cancel(str(marker))], check=True)
    assert subprocess.run(["bash", "-c", command], capture_output=True, text=True).stdout == "seen\n"
    with pytest.raises(NpaValidationError):
        commands.build_if_cancel_marker("relative/marker", "echo seen")


def test_submit_time_takes_slurms_record_of_that_job_only():
    out = "CLUSTER: b\n7|1796216400\n7_1|1796216000\n7|1796216401\n"
    assert commands.parse_submit_time(out, "7") == 1796216400.0
    assert commands.parse_submit_time("", "7") is None


def test_the_submission_honours_a_cancel_marker_before_and_after_sbatch(tmp_path):
    """Run the real submission command with a stand-in sbatch that creates the marker while it "runs" (a kill
    comes in meanwhile): the command then cancels by name. With the marker already there, sbatch never runs."""
    script = tmp_path / "sbatch" / "npa-x-t1.sbatch"
    marker = commands.cancel_marker_for(str(script))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho sbatch >> {calls}\ntouch {marker}\necho 42\n")
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "scancel $*" >> {calls}\n')
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '42|{COMMENT}'\n")
    for tool in ("sbatch", "scancel", "squeue"):
        (bin_dir / tool).chmod(0o755)
    cancel = commands.build_cancel_by_name("npa-x-t1", "npa", COMMENT)
    command, stdin = build_submit(
        build_stage([StagedFile(str(script), b"#!/bin/bash\n")]), str(script), cancel_by_name=cancel
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    first = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, env=env)
    assert first.returncode == 0 and b"42" in first.stdout
    assert calls.read_text().splitlines() == ["sbatch", "scancel 42"]
    again = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, env=env)
    assert again.returncode == 5 and b"NPA_SBATCH_BEGIN" not in again.stdout
    assert calls.read_text().splitlines() == ["sbatch", "scancel 42"]  # nothing more


# -- a cancel by id that names its job reaches only that job of this user ------------------------------------


async def test_a_named_cancel_of_this_user_s_live_job_of_that_name_cancels_it():
    hook, sent = scripted({"scancel": (0, "", ""), "squeue": (0, "7|7|RUNNING|None|c1|npa-x-t1\n", "")})
    assert await hook.acancel("7", job_name="npa-x-t1") == "cancelled"
    assert "squeue -h -t all --user=npa --jobs=7" in sent[0]  # only this user's jobs
    assert [c.split()[0] for c in sent] == ["squeue", "scancel", "squeue"]


async def test_a_named_cancel_whose_id_is_another_job_cancels_nothing():
    """A handle read back from XCom names this task's job but the id of another: nothing is cancelled."""
    hook, sent = scripted({"scancel": (0, "", ""), "squeue": (0, "7|7|RUNNING|None|c1|someone-elses-job\n", "")})
    with pytest.raises(
        NpaCancelFailed, match=r"job 7 was to be npa-x-t1, but the job with that id is someone-elses-job"
    ):
        await hook.acancel("7", job_name="npa-x-t1", marker="/r/sbatch/npa-x-t1.sbatch.npa-cancelled")
    assert not [c for c in sent if "scancel" in c or "npa-cancelled" in c]


@pytest.mark.parametrize(
    ("sacct", "outcome"),
    [
        ("7|7|COMPLETED|0:0|c1|None|5|cpu=1,node=1|npa-x-t1\n", "ended"),
        ("7|7|COMPLETED|0:0|c1|None|5|cpu=1,node=1|other\n", "shows other COMPLETED"),
        ("", "has no record of it"),
    ],
)
async def test_a_named_cancel_of_an_id_slurmctld_does_not_know_for_this_user(sacct, outcome):
    """Another user's job (squeue --user hides it) or one purged after it ended: scancel is never sent; accounting
    (this user's records only) says whether it was this job and ended."""
    hook, sent = scripted({"scancel": (0, "", ""), "squeue": (1, "", INVALID_ID), "sacct": (0, sacct, "")})
    if outcome == "ended":
        assert await hook.acancel("7", job_name="npa-x-t1", shred=["/r/sidecars/npa-x-t1.env"]) == "ended"
        assert any("shred" in c and "/r/sidecars/npa-x-t1.env" in c for c in sent)
    else:
        with pytest.raises(NpaCancelFailed, match=f"slurmctld does not know it as a job of user npa.*{outcome}"):
            await hook.acancel("7", job_name="npa-x-t1", shred=["/r/sidecars/npa-x-t1.env"])
        assert not [c for c in sent if "shred" in c]
    assert (
        "sacct -X --parsable2 --noheader -o JobIDRaw,JobID,State,ExitCode,NodeList,Reason,ElapsedRaw,AllocTRES,"
        "JobName --user=npa -j 7" in sent[1]
    )
    assert not [c for c in sent if c.startswith("scancel") or "; scancel" in c]


# -- what a cancel acts on, derived from the job's handle (every entry point builds it here) -------------------


def _handle(**changes) -> SlurmJobHandle:
    fields = {
        "conn_id": "slurm_x", "cluster": None, "job_id": "7", "job_name": "npa-x-t1", "login_host": "h:22",
        "results_dir": "/r/npa-x-t1", "stdout_path": "/r/logs/main.out", "stderr_path": "/r/logs/main.err",
        "try_number": 1, "script_path": "/r/sbatch/npa-x-t1.sbatch", "env_file": "/r/sidecars/npa-x-t1.env",
    }  # fmt: skip
    return SlurmJobHandle(**{**fields, **changes})


def test_a_handle_s_cancel_has_its_marker_sidecar_end_record_and_name():
    assert CancelRequest.for_handle(_handle()) == CancelRequest(
        "7",
        marker="/r/sbatch/npa-x-t1.sbatch.npa-cancelled",
        shred=("/r/sidecars/npa-x-t1.env",),
        job_name="npa-x-t1",
        end_record="/r/npa-x-t1/child_exit_code",
    )


def test_a_handle_without_script_or_sidecar_creates_no_marker_and_shreds_nothing():
    request = CancelRequest.for_handle(_handle(script_path=None, env_file=None))
    assert (request.marker, request.shred, request.job_name) == (None, (), "npa-x-t1")


def test_a_job_found_by_name_is_cancelled_without_an_end_record_unless_its_results_dir_is_given():
    request = CancelRequest.for_job("8", "npa-x-t1", script_path="/r/sbatch/npa-x-t1.sbatch", shred=["/r/s.env"])
    assert request == CancelRequest("8", "/r/sbatch/npa-x-t1.sbatch.npa-cancelled", ("/r/s.env",), "npa-x-t1")
    assert cancel_marker_of(None) is None


async def test_cancel_one_sends_the_request_as_built(monkeypatch):
    hook, sent = scripted({"scancel": (0, "", ""), "squeue": (0, "7|7|CANCELLED|None|c1|npa-x-t1\n", "")})
    assert await hook.acancel_one(CancelRequest.for_handle(_handle())) == "cancelled"
    assert sent[0].startswith("squeue") and "--user=npa" in sent[0]  # the id is checked against the name first
    assert "/r/sbatch/npa-x-t1.sbatch.npa-cancelled" in sent[1] and "scancel 7 || exit $?" in sent[1]
