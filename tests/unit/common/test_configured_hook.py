"""ConfiguredHook: the connection is read once into a typed config, sync (config) or async (aconfig)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from npa_airflow.common import configured_hook
from npa_airflow.common.configured_hook import ConfiguredHook, shared_configs


@dataclass(frozen=True)
class FakeConfig:
    conn_id: str
    host: str

    @classmethod
    def from_connection(cls, conn: Any) -> FakeConfig:
        return cls(conn_id=conn.conn_id, host=conn.host)


class FakeHook(ConfiguredHook[FakeConfig]):
    conn_name_attr = "fake_conn_id"
    config_type = FakeConfig

    def __init__(self, fake_conn_id: str = "fake_default") -> None:
        super().__init__()
        self.fake_conn_id = fake_conn_id


@pytest.fixture
def reads(monkeypatch) -> list[tuple[str, str]]:
    """Every connection read, as (sync or async, conn_id); served without an Airflow database."""
    calls: list[tuple[str, str]] = []

    def get_connection(conn_id: str) -> Any:
        calls.append(("sync", conn_id))
        return SimpleNamespace(conn_id=conn_id, host=f"host-of-{conn_id}")

    async def aget_connection(conn_id: str) -> Any:
        calls.append(("async", conn_id))
        return SimpleNamespace(conn_id=conn_id, host=f"host-of-{conn_id}")

    monkeypatch.setattr(FakeHook, "get_connection", staticmethod(get_connection))
    monkeypatch.setattr(FakeHook, "aget_connection", staticmethod(aget_connection))
    return calls


def failing_first_read(monkeypatch) -> list[str]:
    """The connection's first read fails, later ones succeed; returns the conn ids read, in order."""
    attempts: list[str] = []

    def get_connection(conn_id: str) -> Any:
        attempts.append(conn_id)
        if len(attempts) == 1:
            raise LookupError("connection not found")
        return SimpleNamespace(conn_id=conn_id, host="h")

    monkeypatch.setattr(FakeHook, "get_connection", staticmethod(get_connection))
    return attempts


def test_config_reads_the_connection_named_by_conn_name_attr_once(reads):
    hook = FakeHook("site_a")
    first = hook.config
    assert first == FakeConfig(conn_id="site_a", host="host-of-site_a")
    assert hook.config is first
    assert reads == [("sync", "site_a")]


async def test_aconfig_reads_the_connection_without_blocking_once(reads):
    hook = FakeHook("site_b")
    first = await hook.aconfig()
    assert first == FakeConfig(conn_id="site_b", host="host-of-site_b")
    assert await hook.aconfig() is first
    assert reads == [("async", "site_b")]


async def test_sync_and_async_share_the_cached_config(reads):
    hook = FakeHook()
    sync_cfg = hook.config
    assert await hook.aconfig() is sync_cfg
    other = FakeHook()
    async_cfg = await other.aconfig()
    assert other.config is async_cfg
    assert reads == [("sync", "fake_default"), ("async", "fake_default")]


def test_each_hook_instance_has_its_own_config(reads):
    a, b = FakeHook("a"), FakeHook("b")
    assert (a.config.host, b.config.host) == ("host-of-a", "host-of-b")
    assert reads == [("sync", "a"), ("sync", "b")]


def test_a_config_that_fails_to_build_is_not_cached(monkeypatch):
    attempts = failing_first_read(monkeypatch)
    hook = FakeHook()
    with pytest.raises(LookupError):
        _ = hook.config
    assert hook.config.host == "h"
    assert attempts == ["fake_default", "fake_default"]


def test_starts_in_a_triggerer_share_one_read_of_a_connection(reads, monkeypatch):
    """Inside shared_configs (the triggerer's starts) a connection is read once per SHARED_CONFIG_SECONDS, by one
    of the threads that ask for it at once; outside, every hook reads its own."""
    now = [1000.0]
    monkeypatch.setattr(configured_hook.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(configured_hook, "_shared", {})

    def start(conn_id: str) -> FakeConfig:
        with shared_configs():
            return FakeHook(conn_id).config

    with ThreadPoolExecutor(8) as pool:
        configs = list(pool.map(start, ["site"] * 16))
    assert len({id(c) for c in configs}) == 1 and reads == [("sync", "site")]
    assert start("other").host == "host-of-other" and len(reads) == 2
    now[0] += configured_hook.SHARED_CONFIG_SECONDS + 1  # an edited connection reaches the next starts
    assert start("site") is not configs[0] and len(reads) == 3
    _ = FakeHook("site").config  # outside: read as before
    assert len(reads) == 4


def test_a_shared_read_that_fails_is_not_kept(monkeypatch):
    attempts = failing_first_read(monkeypatch)
    monkeypatch.setattr(configured_hook, "_shared", {})
    with shared_configs():
        with pytest.raises(LookupError):
            _ = FakeHook().config
        assert FakeHook().config.host == "h" and FakeHook().config.host == "h"
    assert attempts == ["fake_default", "fake_default"]
