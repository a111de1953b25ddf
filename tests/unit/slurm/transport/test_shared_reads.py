"""AsyncSlurmHook.aread_together: the read-only commands that many callers on one loop send to one login host at
once (a triggerer starting many tasks) go in one round trip, a command asked twice runs once, each caller gets its
own answers, and a batch that fails fails each of its callers. The commands run in a real bash, with stand-ins
for scontrol that count their runs."""

from __future__ import annotations

import asyncio

import pytest

from npa_airflow.exceptions import NpaRemoteError, NpaValidationError
from npa_airflow.slurm.hook import SlurmHook
from tests.unit.slurm.transport.test_async_hook import ShellConnection, hook_on


def fake_scontrol(tmp_path, body: str) -> str:
    """A bin dir whose `scontrol` appends its arguments to `runs` and then runs `body`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/runs\n{body}\n')
    (bin_dir / "scontrol").chmod(0o755)
    return str(bin_dir)


PARTITIONS = "PartitionName=gpu Default=YES MaxTime=60 Nodes=g1 TotalNodes=1 State=UP"
NODES = "NodeName=g1 CPUTot=8 RealMemory=1000 Gres=gpu:8 State=IDLE Partitions=gpu"


async def test_many_callers_read_the_cluster_in_one_round_trip_and_each_command_runs_once(tmp_path):
    body = f'case "$*" in *partitions*) echo "{PARTITIONS}";; *nodes*) echo "{NODES}";; esac'
    conn = ShellConnection("bash", path=fake_scontrol(tmp_path, body))
    hooks = [hook_on(conn) for _ in range(12)]  # type: ignore[arg-type]
    inputs = tmp_path / "data"
    inputs.mkdir()

    async def start(hook: SlurmHook, index: int):
        wanted = str(inputs) if index % 2 else str(tmp_path / f"missing-{index}")
        return await asyncio.gather(hook.acluster_layout(), hook.apaths_exist([wanted]), hook.apartitions())

    answers = await asyncio.gather(*(start(hook, i) for i, hook in enumerate(hooks)))

    assert len(conn.sent) == 1  # 12 callers x 3 reads: one SSH command session
    runs = (tmp_path / "runs").read_text().splitlines()
    assert sorted(runs) == ["--oneliner show nodes", "--oneliner show partitions"]  # asked 24 and 12 times
    for index, ((partitions, nodes), exists, alone) in enumerate(answers):
        assert set(partitions) == {"gpu"} and partitions["gpu"].max_time_minutes == 60 and set(nodes) == {"g1"}
        assert set(alone) == {"gpu"}
        assert list(exists.values()) == [bool(index % 2)]  # its own path, its own answer


async def test_reads_that_come_while_a_batch_runs_go_together_into_the_next(tmp_path):
    conn = ShellConnection("bash", path=fake_scontrol(tmp_path, f'sleep 0.3; echo "{PARTITIONS}"'))
    hook = hook_on(conn)  # type: ignore[arg-type]
    first = asyncio.ensure_future(hook.apartitions())
    await asyncio.sleep(0.1)  # the first batch runs
    later = await asyncio.gather(*(hook_on(conn).apaths_exist([str(tmp_path / f"p{i}")]) for i in range(5)))  # type: ignore[arg-type]
    assert set(await first) == {"gpu"}
    assert [list(answer.values()) for answer in later] == [[False]] * 5
    assert len(conn.sent) == 2  # the lone read, then the five that waited for it


async def test_a_batch_that_fails_raises_in_each_of_its_callers(tmp_path):
    conn = ShellConnection("bash", path=fake_scontrol(tmp_path, "exit 0"))

    async def broken(command, *, input=None, **kwargs):  # the batch's own shell fails: no frames come back
        conn.sent.append((command, input))
        return type("Done", (), {"stdout": b"", "stderr": b"mktemp: No space left on device", "exit_status": 1})()

    conn.run = broken  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(hook_on(conn).apaths_exist([f"/p{i}"]) for i in range(4)),  # type: ignore[arg-type]
        return_exceptions=True,
    )
    assert len(conn.sent) == 1
    assert all(isinstance(r, NpaRemoteError) and "No space left" in str(r) for r in results), results
    with pytest.raises(NpaRemoteError):  # the next read is a new batch, not a stale failure
        await hook_on(conn).apartitions()  # type: ignore[arg-type]
    assert len(conn.sent) == 2


def fake_lookup_tools(tmp_path) -> str:
    """`sacct` and `squeue` stand-ins that log their arguments to `runs` and answer a record for each name of
    their --name list ("job-<id>"): accounting says COMPLETED, slurmctld knows the even ids as RUNNING."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    parse = 'for a in "$@"; do case $a in --name=*) IFS=, read -ra names <<< "${a#--name=}";; esac; done'
    sacct = 'echo "$id|$id|COMPLETED|0:0|c1|None|$n|1796216400|npa1:x:y"'
    squeue = '((id % 2)) || echo "$id|$id|RUNNING|None|c1|$n|1796216400|npa1:x:y"'
    for tool, line in (("sacct", sacct), ("squeue", squeue)):
        body = f'echo "{tool} $*" >> {tmp_path}/runs\n{parse}\nfor n in "${{names[@]}}"; do id=${{n##*-}}; {line}; done'
        (bin_dir / tool).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    return str(bin_dir)


def states_of(jobs) -> dict[str, str]:
    return {job.job_name: job.native_state for job in jobs}


async def test_lookups_by_name_of_many_callers_share_one_sacct_and_one_squeue(tmp_path):
    conn = ShellConnection("bash", path=fake_lookup_tools(tmp_path))
    asked = [[f"job-{i}", f"job-{i + 100}"] for i in range(12)]
    answers = await asyncio.gather(*(hook_on(conn).afind_jobs_by_name(names) for names in asked))  # type: ignore[arg-type]

    assert len(conn.sent) == 1  # 12 lookups: one SSH command session
    runs = (tmp_path / "runs").read_text().splitlines()
    assert [run.split()[0] for run in runs] == ["sacct", "squeue"]
    for names, jobs in zip(asked, answers, strict=True):  # each its own jobs; the live view wins over accounting
        assert states_of(jobs) == {name: "RUNNING" if int(name[4:]) % 2 == 0 else "COMPLETED" for name in names}


async def test_a_large_lookup_is_split_into_commands_and_batches_below_the_login_hosts_limit(tmp_path, monkeypatch):
    from npa_airflow.slurm.transport import async_hook, job_queries

    monkeypatch.setattr(job_queries, "NAMES_PER_LOOKUP", 4)
    monkeypatch.setattr(async_hook, "READ_BATCH_BYTES", 900)  # about two commands per round trip
    conn = ShellConnection("bash", path=fake_lookup_tools(tmp_path))
    asked = [[f"job-{i}"] for i in range(10)]
    answers = await asyncio.gather(*(hook_on(conn).afind_jobs_by_name(names) for names in asked))  # type: ignore[arg-type]

    runs = (tmp_path / "runs").read_text().splitlines()
    assert sorted(run.split()[0] for run in runs) == ["sacct"] * 3 + ["squeue"] * 3  # 4 + 4 + 2 names
    assert len(conn.sent) >= 3  # the six commands did not go in one
    assert all(len(sent) < 2000 for sent, _ in conn.sent)
    for (name,), jobs in zip(asked, answers, strict=True):
        assert list(states_of(jobs)) == [name]


async def test_a_bad_name_fails_its_own_lookup_only_and_before_anything_is_sent(tmp_path):
    conn = ShellConnection("bash", path=fake_lookup_tools(tmp_path))
    bad, good = await asyncio.gather(
        hook_on(conn).afind_jobs_by_name(["job-1", "x;reboot"]),  # type: ignore[arg-type]
        hook_on(conn).afind_jobs_by_name(["job-2"]),  # type: ignore[arg-type]
        return_exceptions=True,
    )
    assert isinstance(bad, NpaValidationError) and "x;reboot" in str(bad)
    assert states_of(good) == {"job-2": "RUNNING"}
    assert "reboot" not in (tmp_path / "runs").read_text()
