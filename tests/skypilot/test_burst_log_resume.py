"""The Burst job's log reaches the task log once, in order, across an API-server outage and triggerer restarts.

A ticking job ("tick i of N", each tick written in two parts so the log often ends in a line without its
newline yet, and a last line with no newline at all) runs on SkyPilot's Slurm infra on the local cluster; the real
`BurstJobTrigger` follows it against the real API server (dev/skypilot), which the outage test stops for 40 s.
A triggerer restart is the trigger's run cancelled and a new trigger run from the same serialized kwargs; the
task instance's XCom, where the count of lines written is kept, goes through a stand-in for the triggerer's
supervisor channel (tests/supervisor_double.py); the real channel is in tests/e2e/test_production_burst_stall.py.
Needs the local Slurm cluster; slow (a few minutes each).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import time

import pytest

from npa_airflow.burst import client as sky
from npa_airflow.burst import joblog
from npa_airflow.burst.handle import BurstJobHandle
from npa_airflow.burst.task import BurstSpec, build_task, dag_yaml
from npa_airflow.burst.triggers import BurstJobTrigger
from npa_airflow.common import xcom_keys
from tests.skypilot.conftest import SKY_SCRIPT
from tests.supervisor_double import install_supervisor, run_for_task_instance

pytestmark = pytest.mark.slow

CLUSTER = "npa-e2e-logresume"
LAST_LINE = "ticker done, no newline"
TICK = re.compile(r"tick (\d+) of \d+$")  # after SkyPilot's "(<task>, pid=<pid>) " prefix


def ticker(ticks: int, period: float) -> str:
    """The job: numbered lines, each written in two parts; a last line without a newline."""
    return (
        f'for i in $(seq 1 {ticks}); do printf "tick %d " "$i"; sleep 0.05; printf "of {ticks}\\n"; '
        f'sleep {period}; done; printf "{LAST_LINE}"'
    )


class Written(logging.Handler):
    """What a trigger writes to the task log, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def ticks_in(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := TICK.search(line))]


def last_lines(lines: list[str]) -> int:
    return sum(line.endswith(LAST_LINE) for line in lines)


def following(kwargs: dict, name: str) -> tuple[BurstJobTrigger, list[str]]:
    """A trigger as a triggerer runs it (with its task instance), its task log captured."""
    trigger = run_for_task_instance(BurstJobTrigger(**kwargs))
    log = logging.getLogger(f"test.logresume.{name}.{time.monotonic_ns()}")
    log.setLevel(logging.INFO)
    written = Written()
    log.addHandler(written)
    trigger._log = log
    return trigger, written.lines


async def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.5)


async def _launch(endpoint: str, infra: str, name: str, ticks: int, period: float) -> BurstJobHandle:
    spec = BurstSpec(image=None, nodes=1, accelerators="GPU:1", command="true", name=name, infra=infra)
    task = build_task(spec, ticker(ticks, period))
    async with sky.AsyncSkyPilotClient(endpoint) as client:
        request_id = await client.submit(sky.build_launch(client.identity, dag_yaml(task), CLUSTER))
    return BurstJobHandle(
        conn_id="skypilot_default",
        endpoint=endpoint,
        cluster=CLUSTER,
        name=name,
        request_id=request_id,
        submitted_at=time.time(),
    )


async def _stop_api_server(seconds: float) -> float:
    """Stop the API server (dev/skypilot down), keep it down ``seconds``, start it again; the outage's length."""
    await asyncio.to_thread(subprocess.run, [str(SKY_SCRIPT), "down"], check=True, timeout=120)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    await asyncio.to_thread(subprocess.run, [str(SKY_SCRIPT), "up"], check=True, timeout=300)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def log_cluster(skypilot_server, skypilot_slurm):
    """The tests' cluster, launched by the first test and taken down at the end."""
    yield skypilot_slurm
    with sky.SkyPilotClient(skypilot_server) as client:
        if CLUSTER in sky.parse_clusters(client.call(sky.build_status(client.identity))):
            client.call(sky.build_down(client.identity, CLUSTER), timeout=600)


@pytest.mark.parametrize(
    "ticks, period, outage_at",
    [(150, 0.45, 20), (60, 0.2, 10)],
    ids=["back-while-the-job-runs", "job-ends-during-the-outage"],
)
async def test_every_line_once_across_a_40s_api_server_outage(
    skypilot_server, log_cluster, monkeypatch, ticks, period, outage_at
):
    install_supervisor(monkeypatch, "deferred")
    handle = await _launch(skypilot_server, log_cluster, "logresume-outage", ticks, period)
    kwargs = BurstJobTrigger(handle=handle.to_dict(), poll_interval=2, nodes=1).serialize()[1]
    trigger, lines = following(kwargs, "outage")
    run = asyncio.ensure_future(trigger.run().__anext__())
    try:
        await _wait_for(lambda: len(ticks_in(lines)) >= outage_at or run.done(), 900, f"tick {outage_at}")
        assert not run.done(), f"the trigger ended early: {run.result().payload}"
        outage = await _stop_api_server(40)
        event = (await asyncio.wait_for(run, 600)).payload
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    got = ticks_in(lines)
    print(f"\n[fault] API server down {outage:.0f}s from tick {outage_at}: {len(got)} of {ticks} ticks in the log")
    assert event["status"] == "success", event
    assert got == list(range(1, ticks + 1)), f"{len(got)} ticks, lost {sorted(set(range(1, ticks + 1)) - set(got))}"
    assert last_lines(lines) == 1


async def test_every_line_once_across_a_triggerer_restart_and_none_from_a_superseded_trigger(
    skypilot_server, log_cluster, monkeypatch
):
    supervisor = install_supervisor(monkeypatch, "deferred")
    # A takeover follows a stall of the holder longer than its claim stays fresh; without a stall here, the claim
    # is checked before every line instead.
    monkeypatch.setattr(joblog, "CLAIM_FRESH_SECONDS", 0.0)
    ticks = 150
    handle = await _launch(skypilot_server, log_cluster, "logresume-restart", ticks, 0.35)
    kwargs = BurstJobTrigger(handle=handle.to_dict(), poll_interval=2, nodes=1).serialize()[1]
    written: dict[str, list[str]] = {}
    claims: list[str] = []
    counts: list[str] = []
    second_at_takeover: list[int] = []
    plain_asend = supervisor.asend

    async def asend(msg):
        if type(msg).__name__ == "SetXCom" and msg.key == xcom_keys.BURST_LOG_LINES:
            counts.append(msg.value)
        if type(msg).__name__ == "SetXCom" and msg.key == xcom_keys.TRIGGER_CLAIM:
            if len(claims) == 2:  # the third trigger's claim: what the second one wrote until now
                second_at_takeover.append(len(written["second"]))
            claims.append(msg.value)
        return await plain_asend(msg)

    supervisor.asend = asend

    def start(name: str) -> asyncio.Future:
        trigger, written[name] = following(kwargs, name)
        return asyncio.ensure_future(trigger.run().__anext__())

    first = start("first")
    await _wait_for(lambda: len(ticks_in(written["first"])) >= 30 or first.done(), 900, "tick 30")
    assert not first.done(), f"the trigger ended early: {first.result().payload}"
    first.cancel()  # a triggerer restart: the trigger's task is cancelled, then it runs elsewhere
    with contextlib.suppress(asyncio.CancelledError):
        await first

    second = start("second")
    await _wait_for(lambda: len(ticks_in(written["first"] + written["second"])) >= 90, 300, "tick 90")
    assert not second.done(), f"the trigger ended early: {second.result().payload}"
    third = start("third")  # takes the job over while the second one still runs
    event = (await asyncio.wait_for(third, 600)).payload
    second.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await second

    first_lines, second_lines, third_lines = written["first"], written["second"], written["third"]
    restarted = ticks_in(first_lines + second_lines[: second_at_takeover[0]])
    taken_over = ticks_in(third_lines)
    resumed_at = taken_over[0]
    print(
        f"\n[fault] triggerer restart at tick {len(ticks_in(first_lines))}: ticks 1-{len(restarted)} once each; "
        f"the takeover resumed at tick {resumed_at} ({len(restarted) + 1 - resumed_at} replayed)"
    )
    assert event["status"] == "success", event
    assert restarted == list(range(1, len(restarted) + 1)), "the restart lost or replayed lines"
    assert not [line for line in second_lines if line.startswith("[launch]")], "the launch log was replayed"
    superseded_wrote = ticks_in(second_lines[second_at_takeover[0] :])
    assert not superseded_wrote, f"the superseded trigger wrote ticks after the takeover: {superseded_wrote}"
    assert taken_over == list(range(resumed_at, ticks + 1)) and resumed_at <= len(restarted) + 1
    assert last_lines(third_lines) == 1
    kept = [int(value.split()[-1]) for value in counts]
    assert kept == sorted(kept), f"the count was wound back: {counts}"
