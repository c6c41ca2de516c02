"""A named registry with ownership: the one implementation behind every ``register`` hook.

Adaptors, strategies, metrics, backend profiles, examples and executors are all "a name
-> a thing, provided by one plugin". Writing that once gives every kind the same rules:
two plugins may not claim one name, an unknown name says what is installed, and the
names a plugin registered can be dropped when it fails or is unregistered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from ..errors import ConfigError, PluginError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """``name -> item`` for one kind of thing (``"strategy"``, ``"metric"``, ...)."""

    def __init__(self, kind: str, *, none_installed_hint: str = "none installed") -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._owners: dict[str, str] = {}
        self._none_installed_hint = none_installed_hint

    def add(self, name: str, item: T, owner: str) -> None:
        """Register ``item`` as ``name`` for plugin ``owner``; a name has one owner."""
        current = self._owners.get(name)
        if current is not None and current != owner:
            raise PluginError(f"{self.kind} {name!r} is already registered by plugin {current!r}")
        self._owners[name] = owner
        self._items[name] = item

    def drop_owner(self, owner: str) -> None:
        """Forget everything ``owner`` registered (it failed, or was unregistered)."""
        for name in [n for n, o in self._owners.items() if o == owner]:
            del self._owners[name], self._items[name]

    def owner(self, name: str) -> str | None:
        return self._owners.get(name)

    def get_or_raise(self, name: str) -> T:
        """The item called ``name``, or a :class:`ConfigError` naming what is installed."""
        if name not in self._items:
            installed = ", ".join(sorted(self._items)) or self._none_installed_hint
            raise ConfigError(f"unknown {self.kind} {name!r}", hint=f"installed: {installed}")
        return self._items[name]

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
