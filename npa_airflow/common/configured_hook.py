"""The base of this provider's hooks: an Airflow connection read once into a typed, validated config.

Inside `shared_configs()` (a triggerer starting tasks, `npa_airflow.slurm.start_trigger`) hooks of one connection
id share its config for `SHARED_CONFIG_SECONDS`: there each read is a round trip through the triggerer's supervisor
(the connection, then one more for every secret it registers with the masker), and a thousand starts would queue
behind them. A worker reads its connection once per task, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar, Generic, TypeVar

from airflow.sdk import BaseHook

C = TypeVar("C")
SHARED_CONFIG_SECONDS = 30.0  # an edited connection reaches new starts within this
_sharing: ContextVar[bool] = ContextVar("npa_shared_configs", default=False)
_shared: dict[tuple[Any, str], tuple[float, Any]] = {}
_reading = threading.Lock()  # one read per connection when many starts miss it at once


@contextmanager
def shared_configs() -> Iterator[None]:
    """Within: hooks share their connection's config (see the module docstring)."""
    token = _sharing.set(True)
    try:
        yield
    finally:
        _sharing.reset(token)


def _config_of(config_type: Any, conn_id: str, read: Callable[[], Any]) -> Any:
    if not _sharing.get():
        return read()
    key = (config_type, conn_id)
    with _reading:
        hit = _shared.get(key)
        if hit is not None and time.monotonic() - hit[0] < SHARED_CONFIG_SECONDS:
            return hit[1]
        config = read()
        _shared[key] = (time.monotonic(), config)
        return config


class ConfiguredHook(BaseHook, Generic[C]):
    """Subclasses name the attribute holding the connection id (``conn_name_attr``, Airflow's convention) and the
    config class, which builds itself with ``from_connection(conn)``."""

    conn_name_attr: str
    config_type: ClassVar[Any]
    _config: C | None = None

    @property
    def config(self) -> C:
        if self._config is None:
            conn_id = getattr(self, self.conn_name_attr)
            self._config = _config_of(
                self.config_type, conn_id, lambda: self.config_type.from_connection(self.get_connection(conn_id))
            )
        return self._config

    async def aconfig(self) -> C:
        """The config, reading the connection without blocking the event loop (triggers)."""
        if self._config is None:
            conn = await self.aget_connection(getattr(self, self.conn_name_attr))
            self._config = self.config_type.from_connection(conn)
        return self._config
