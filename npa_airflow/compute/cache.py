"""A short-lived answer cache shared by every process of one host (all api-server workers), in files.

One file per key holds the last answer, the time it was fetched and the items it covers. A reader whose answer
is stale (or does not cover what it needs) has it refreshed in the background: one refresh per key in flight in a
process, on a small pool of threads (REFRESH_THREADS), which takes the key's lock file (``flock``), reads again,
and only if the answer is still stale fetches a new one: N viewers and M worker processes refreshing at once cost
one fetch. A reader with a stale answer that covers its items gets it at once; one without waits for the refresh
at most ``wait`` seconds, then takes what the file holds. A cluster that does not answer costs one pool thread per
key, never the request threads of the API server.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFRESH_THREADS = 4  # per process: at most this many keys are fetched at once, the others wait their turn
DEFAULT_WAIT = 0.5  # how long a reader waits for a refresh before taking the answer the file holds
NO_ANSWER_YET = "no answer from the cluster yet (asking it)"
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_in_flight: dict[str, concurrent.futures.Future[None]] = {}
_in_flight_lock = threading.Lock()


def _refresher() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _in_flight_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(REFRESH_THREADS, thread_name_prefix="npa-compute-refresh")
        return _pool


@dataclass(frozen=True)
class CachedAnswer:
    fetched_at: float
    covers: tuple[str, ...]  # the items the fetch asked about
    value: Any  # JSON
    error: str | None = None  # the fetch failed: this message is served until the entry goes stale


class SharedCache:
    """``get(key, items, fetch)``: the cached answer for ``items`` if younger than ``ttl`` s, else ``fetch(items)``."""

    def __init__(self, directory: str | os.PathLike[str], ttl: float, clock: Callable[[], float] = time.time) -> None:
        self.directory = Path(directory)
        self.ttl = ttl
        self.clock = clock

    def _path(self, key: str, suffix: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return self.directory / f"{digest}.{suffix}"

    def _read(self, key: str) -> CachedAnswer | None:
        try:
            data = json.loads(self._path(key, "json").read_text())
            return CachedAnswer(data["fetched_at"], tuple(data["covers"]), data["value"], data.get("error"))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _fresh(self, answer: CachedAnswer | None, items: Sequence[str]) -> bool:
        if answer is None:
            return False
        age = self.clock() - answer.fetched_at
        return 0 <= age < self.ttl and set(items) <= set(answer.covers)

    def _write(self, key: str, answer: CachedAnswer) -> None:
        target = self._path(key, "json")
        data = {"fetched_at": answer.fetched_at, "covers": list(answer.covers), "value": answer.value}
        data["error"] = answer.error
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, target)  # readers see the old or the new file, never half of one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(
        self, key: str, items: Sequence[str], fetch: Callable[[Sequence[str]], Any], wait: float = DEFAULT_WAIT
    ) -> CachedAnswer:
        """The answer covering ``items``: cached when fresh, else refreshed (one fetch for all readers); a stale
        answer that covers ``items`` is returned at once, otherwise the refresh is waited for at most ``wait``
        seconds, then the answer the file holds is returned (partial, or one saying there is none yet).

        A fetch that raises is cached as an error for ``ttl`` too (an unreachable cluster is not asked again
        by every viewer); the message is the exception's text.
        """
        answer = self._read(key)
        if self._fresh(answer, items):
            return answer  # type: ignore[return-value]
        refresh = self._refresh(key, items, fetch)
        if answer is not None and set(items) <= set(answer.covers):
            return answer  # stale but complete: served now, the refresh goes on in the background
        try:
            refresh.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            pass
        answer = self._read(key)
        return answer if answer is not None else CachedAnswer(0.0, (), None, NO_ANSWER_YET)

    def _refresh(
        self, key: str, items: Sequence[str], fetch: Callable[[Sequence[str]], Any]
    ) -> concurrent.futures.Future[None]:
        """The refresh of ``key`` in flight in this process, started if there is none."""
        with _in_flight_lock:
            running = _in_flight.get(self._path(key, "json").as_posix())
            if running is not None and not running.done():
                return running
        future = _refresher().submit(self._fetch_locked, key, tuple(items), fetch)
        with _in_flight_lock:
            _in_flight[self._path(key, "json").as_posix()] = future
        return future

    def _fetch_locked(self, key: str, items: Sequence[str], fetch: Callable[[Sequence[str]], Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self._path(key, "lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes; another process may be fetching
            if self._fresh(self._read(key), items):
                return
            started = self.clock()
            try:
                answer = CachedAnswer(started, tuple(items), fetch(items))
            except Exception as exc:
                answer = CachedAnswer(started, tuple(items), None, f"{type(exc).__name__}: {exc}")
            self._write(key, answer)
