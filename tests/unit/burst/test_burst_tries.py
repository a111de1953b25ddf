"""What earlier tries left and what a new try does about it (burst/tries.py), over a scripted client."""

from __future__ import annotations

import asyncio

from npa_airflow.burst import client as sky
from npa_airflow.burst.hook import SkyPilotHook
from npa_airflow.burst.tries import TryLaunch, TryRef, launch_of, observe_tries, plan
from tests.harness.burst_doubles import RID, ScriptedClient

T1, T2, T3 = (TryRef(n, f"npa-demo-0123456789-t{n}", f"npa-demo-0123456789-t{n}") for n in (1, 2, 3))
PINNED = TryRef(1, "npa-demo-0123456789-t1", "shared")


def launch(status: str, created: float = 1.0, dag_name: str | None = None, cluster: str | None = None, rid=RID):
    return sky.RequestResult(
        request_id=rid, name="sky.launch", status=status, created_at=created, dag_name=dag_name, cluster_name=cluster
    )


def test_a_live_earlier_launch_is_adopted_and_older_duplicates_are_cancelled():
    live1 = TryLaunch(T1, launch("RUNNING"), "INIT")
    live2 = TryLaunch(T2, launch("SUCCEEDED"), "UP", job_id=1, job_state="RUNNING")
    steps = plan([live1, live2, TryLaunch(T3)], own_try=3, on_previous_try="reattach")
    assert (steps.adopt, steps.cancel, steps.take_down) == (live2, (live1,), ())


def test_cancel_mode_cancels_every_live_earlier_launch_and_ended_clusters_go():
    live = TryLaunch(T1, launch("SUCCEEDED"), "UP", job_id=1, job_state="PENDING")
    ended = TryLaunch(T2, launch("SUCCEEDED"), "UP", job_id=1, job_state="FAILED")
    steps = plan([live, ended, TryLaunch(T3)], own_try=3, on_previous_try="cancel")
    assert (steps.adopt, steps.cancel, steps.take_down) == (None, (live,), (ended,))


def test_this_trys_own_launch_is_adopted_whatever_the_mode():
    mine = TryLaunch(T2, launch("SUCCEEDED"), "UP", job_id=1, job_state="SUCCEEDED")
    assert plan([TryLaunch(T1), mine], own_try=2, on_previous_try="cancel").adopt == mine


def test_what_counts_as_live():
    assert TryLaunch(T1, launch("PENDING")).live  # a launch still in flight, no cluster yet
    assert TryLaunch(T1, launch("SUCCEEDED"), "UP", job_id=1, state_unread=True).live
    assert not TryLaunch(T1, launch("FAILED"), "INIT").live
    assert TryLaunch(T1, launch("FAILED"), "INIT").left_over
    assert not TryLaunch(T1, launch("SUCCEEDED"), "UP", job_id=1, job_state=None).live  # no such job any more
    assert not TryLaunch(PINNED, launch("SUCCEEDED"), "UP", job_id=1, job_state="FAILED").left_over  # shared


def test_a_launch_belongs_to_the_try_it_is_named_after():
    old, new = launch("FAILED", 1.0, T1.try_name), launch("RUNNING", 2.0, T1.try_name)
    other = launch("RUNNING", 3.0, "npa-other-0123456789-t1")
    assert launch_of(PINNED, [old, new, other]) == new
    assert launch_of(PINNED, [launch("RUNNING", dag_name=None)]) is None  # a pinned cluster is shared
    assert launch_of(T1, [launch("RUNNING", dag_name=None)]) is not None  # the try's own cluster is not


def test_observe_reads_clusters_once_then_each_trys_launch_and_job():
    finished = launch("SUCCEEDED", dag_name=T1.try_name, cluster=T1.cluster)
    got = sky.RequestResult(request_id=RID, name="sky.launch", status="SUCCEEDED", return_value={"job_id": 4})
    client = ScriptedClient(
        [
            [{"name": T1.cluster, "status": "UP", "launched_at": 100.0}],  # /status for both names
            {RID: finished},  # requests of t1's cluster
            {},  # requests of t2's cluster
            got,  # /api/get of t1's launch
            {"4": "RUNNING"},  # /job_status
        ]
    )
    found = asyncio.run(observe_tries(SkyPilotHook(client=client), [T1, T2]))
    assert found[0] == TryLaunch(T1, finished, "UP", 100.0, job_id=4, job_state="RUNNING")
    assert found[1] == TryLaunch(T2)
    assert client.asked[0][1].body["cluster_names"] == [T1.cluster, T2.cluster]


def test_observe_finds_the_job_on_a_cluster_whose_launch_the_server_dropped():
    client = ScriptedClient(
        [
            [{"name": T1.cluster, "status": "UP"}],
            {},
            [{"job_id": 1, "status": "FAILED"}, {"job_id": 2, "status": "RUNNING"}],
        ]
    )
    (found,) = asyncio.run(observe_tries(SkyPilotHook(client=client), [T1]))
    assert (found.job_id, found.job_state, found.live, found.request) == (2, "RUNNING", True, None)
    assert client.asked[-1][1].path == "/queue"
