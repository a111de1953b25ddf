"""The base of this provider's hooks: an Airflow connection read once into a typed, validated config."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from airflow.sdk import BaseHook

C = TypeVar("C")


class ConfiguredHook(BaseHook, Generic[C]):
    """Subclasses name the attribute holding the connection id (``conn_name_attr``, Airflow's convention) and the
    config class, which builds itself with ``from_connection(conn)``."""

    conn_name_attr: str
    config_type: ClassVar[Any]
    _config: C | None = None

    @property
    def config(self) -> C:
        if self._config is None:
            self._config = self.config_type.from_connection(self.get_connection(getattr(self, self.conn_name_attr)))
        return self._config

    async def aconfig(self) -> C:
        """The config, reading the connection without blocking the event loop (triggers)."""
        if self._config is None:
            conn = await self.aget_connection(getattr(self, self.conn_name_attr))
            self._config = self.config_type.from_connection(conn)
        return self._config
