"""ConfiguredHook: the connection is read once into a typed config, sync (config) or async (aconfig)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from npa_airflow.common.configured_hook import ConfiguredHook


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
    attempts: list[str] = []

    def get_connection(conn_id: str) -> Any:
        attempts.append(conn_id)
        if len(attempts) == 1:
            raise LookupError("connection not found")
        return SimpleNamespace(conn_id=conn_id, host="h")

    monkeypatch.setattr(FakeHook, "get_connection", staticmethod(get_connection))
    hook = FakeHook()
    with pytest.raises(LookupError):
        _ = hook.config
    assert hook.config.host == "h"
    assert attempts == ["fake_default", "fake_default"]
