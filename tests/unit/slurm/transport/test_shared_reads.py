"""AsyncSlurmHook.aread_together: the read-only commands that many callers on one loop send to one login host at
once (a triggerer starting many tasks) go in one round trip, a command asked twice runs once, each caller gets its
own answers, and a batch that fails fails each of its callers. The commands run in a real bash, with stand-ins
for scontrol that count their runs."""

from __future__ import annotations

import asyncio

import pytest

from npa_airflow.exceptions import NpaRemoteError
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
