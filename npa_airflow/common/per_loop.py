"""What belongs to one event loop: an object per (running loop, key), made on first use, gone with its loop.

An asyncio object (a connection, a lock, a batch's future) works only on the loop that made it, and a process may
run several loops (the triggerer's, the background loop's, a test's): the cluster channels and the pollers are
kept here, one per loop and key.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PerLoop(Generic[K, V]):
    """``get(key, make)``: the running loop's object of ``key``, made by ``make()`` the first time."""

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[K, V]] = weakref.WeakKeyDictionary()

    def get(self, key: K, make: Callable[[], V]) -> V:
        mine = self._by_loop.setdefault(asyncio.get_running_loop(), {})
        found = mine.get(key)
        if found is None:
            found = mine[key] = make()
        return found

    def on_running_loop(self) -> list[V]:
        """The running loop's objects, in the order they were made."""
        return list(self._by_loop.get(asyncio.get_running_loop(), {}).values())

    def clear(self) -> None:
        """Forget every object of every loop."""
        self._by_loop.clear()
