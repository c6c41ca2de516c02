"""Pytest fixtures lpq registers for every project that has lpq-core installed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lpq.plugins.manager import PluginManager
from lpq.testing.isolation import fresh_plugin_manager


@pytest.fixture
def lpq_plugin_manager() -> Iterator[PluginManager]:
    """A fresh process-wide plugin manager for one test; the previous one is restored."""
    with fresh_plugin_manager() as pm:
        yield pm


@pytest.fixture
def lpq_plugin(lpq_plugin_manager: PluginManager) -> Callable[..., PluginManager]:
    """Register a plugin object for this test only: ``lpq_plugin(obj, name="x")``."""

    def register(plugin: object, name: str | None = None) -> PluginManager:
        lpq_plugin_manager.load()
        lpq_plugin_manager.register(plugin, name=name or f"test-plugin-{id(plugin)}")
        return lpq_plugin_manager

    return register
