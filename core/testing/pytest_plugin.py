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


# --------------------------------------------------------------------------- CPU features

_CPU_FLAGS_MARKER = (
    "cpu_flags(flags, hardware=False): plan for a CPU with these int8 features "
    "(sets LPQ_CPU_FLAGS for the test); hardware=True also skips the test, with the reason, "
    "where the real CPU lacks them (its kernels' results depend on them)"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _CPU_FLAGS_MARKER)


@pytest.fixture(autouse=True)
def _lpq_cpu_flags(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Honour ``@pytest.mark.cpu_flags``: a test that depends on the CPU says which one."""
    marker = request.node.get_closest_marker("cpu_flags")
    if marker is None:
        return
    from lpq.hardware import ENV_CPU_FLAGS, detected_features, features_from_flags

    flags = str(marker.args[0])
    if marker.kwargs.get("hardware"):
        missing = set(features_from_flags(flags).flags) - set(detected_features().flags)
        if missing:
            pytest.skip(
                f"needs a CPU with {' '.join(sorted(missing))}: its result depends on the "
                "int8 kernels that run, not only on lpq's plan"
            )
    monkeypatch.setenv(ENV_CPU_FLAGS, flags)
