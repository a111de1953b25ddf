"""A short-lived answer cache shared by every process of one host (all api-server workers), in files.

One file per key holds the last answer, the time it was fetched and the items it covers. A reader whose answer
is stale (or does not cover what it needs) takes the key's lock file (``flock``), reads again, and only if the
answer is still stale fetches a new one: N viewers and M worker processes refreshing at once cost one fetch.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def get(self, key: str, items: Sequence[str], fetch: Callable[[Sequence[str]], Any]) -> CachedAnswer:
        """The answer covering ``items``: cached when fresh, else fetched once (others wait on the lock).

        A fetch that raises is cached as an error for ``ttl`` too (an unreachable cluster is not asked again
        by every viewer); the message is the exception's text.
        """
        answer = self._read(key)
        if self._fresh(answer, items):
            return answer  # type: ignore[return-value]
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self._path(key, "lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            answer = self._read(key)
            if self._fresh(answer, items):
                return answer  # type: ignore[return-value]
            started = self.clock()
            try:
                answer = CachedAnswer(started, tuple(items), fetch(items))
            except Exception as exc:
                answer = CachedAnswer(started, tuple(items), None, f"{type(exc).__name__}: {exc}")
            self._write(key, answer)
            return answer
