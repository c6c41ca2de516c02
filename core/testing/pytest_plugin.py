"""Pytest fixtures lpq registers for every project that has lpq-core installed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lpq.plugins import manager as _manager_module
from lpq.plugins.manager import PluginManager


@pytest.fixture
def lpq_plugin_manager() -> Iterator[PluginManager]:
    """A fresh process-wide plugin manager for one test; the previous one is restored."""
    saved = _manager_module._manager
    _manager_module.reset_plugin_manager()
    pm = _manager_module.get_plugin_manager()
    try:
        yield pm
    finally:
        _manager_module._manager = saved


@pytest.fixture
def lpq_plugin(lpq_plugin_manager: PluginManager) -> Callable[..., PluginManager]:
    """Register a plugin object for this test only: ``lpq_plugin(obj, name="x")``."""

    def register(plugin: object, name: str | None = None) -> PluginManager:
        lpq_plugin_manager.load()
        lpq_plugin_manager.register(plugin, name=name or f"test-plugin-{id(plugin)}")
        return lpq_plugin_manager

    return register
