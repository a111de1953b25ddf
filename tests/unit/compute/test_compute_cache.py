"""The shared answer cache: one fetch per key and refresh, across threads and across processes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

from npa_airflow.compute.cache import SharedCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_fresh_answer_is_served_without_fetching_again(tmp_path):
    clock, calls = Clock(), []
    cache = SharedCache(tmp_path, ttl=10, clock=clock)
    fetch = lambda ids: calls.append(list(ids)) or {i: "RUNNING" for i in ids}  # noqa: E731
    assert cache.get("k", ["1", "2"], fetch).value == {"1": "RUNNING", "2": "RUNNING"}
    clock.now += 9
    assert cache.get("k", ["2"], fetch).value == {"1": "RUNNING", "2": "RUNNING"}  # a subset is covered
    assert calls == [["1", "2"]]
    cache.get("k", ["1", "3"], fetch)  # a job the answer does not cover: asked again
    clock.now += 10
    stale = cache.get("k", ["1", "3"], fetch)  # stale: served at once, refreshed in the background
    assert stale.value == {"1": "RUNNING", "3": "RUNNING"} and stale.fetched_at == 1009
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [["1", "2"], ["1", "3"], ["1", "3"]]


def test_a_failed_fetch_is_cached_as_an_error_for_the_same_time(tmp_path):
    clock, calls = Clock(), []

    def fetch(ids):
        calls.append(ids)
        raise ConnectionError("login host down")

    cache = SharedCache(tmp_path, ttl=10, clock=clock)
    first = cache.get("k", ["1"], fetch)
    assert first.value is None and first.error == "ConnectionError: login host down"
    assert cache.get("k", ["1"], fetch).error == first.error and len(calls) == 1


def test_concurrent_readers_in_one_process_share_one_fetch(tmp_path):
    calls = []

    def fetch(ids):
        calls.append(ids)
        time.sleep(0.3)
        return {"n": len(calls)}

    cache = SharedCache(tmp_path, ttl=30)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(cache.get("k", ["1"], fetch).value)) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and answers == [{"n": 1}] * 10


def _reader(directory: str, log: str, barrier) -> None:
    def fetch(ids):
        with open(log, "a") as fh:
            fh.write("fetch\n")
        time.sleep(0.3)
        return {"ok": True}

    barrier.wait()
    SharedCache(directory, ttl=30).get("slurm|slurm_default|", ["1", "2"], fetch)


def test_worker_processes_share_one_fetch(tmp_path):
    """Several api-server workers are separate processes: the file lock makes them share one fetch."""
    log = tmp_path / "fetches"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_reader, args=(str(tmp_path / "cache"), str(log), barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert Path(log).read_text().splitlines() == ["fetch"]


def test_a_cluster_that_does_not_answer_never_holds_a_reader_past_its_wait(tmp_path):
    """The API server's request threads: a hung fetch is waited for `wait` seconds, then the reader gets what the
    file holds (none yet, later the stale answer); readers meanwhile start no second fetch."""
    release, calls = threading.Event(), []

    def hung(ids):
        calls.append(ids)
        release.wait(30)
        return {"1": "RUNNING"}

    cache = SharedCache(tmp_path, ttl=0.01)
    started = time.monotonic()
    answers = [cache.get("k", ["1"], hung, wait=0.2) for _ in range(5)]
    assert time.monotonic() - started < 3
    assert {a.error for a in answers} == {"no answer from the cluster yet (asking it)"} and len(calls) == 1
    release.set()
    deadline = time.monotonic() + 10
    while cache._read("k") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    release.clear()
    started = time.monotonic()
    stale = cache.get("k", ["1"], hung, wait=5)  # stale at once (ttl 10 ms): served without waiting for the refresh
    assert time.monotonic() - started < 1 and stale.value == {"1": "RUNNING"}
    deadline = time.monotonic() + 10
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 2
    release.set()
