"""A plugin manager of one's own for a test: the process-wide one is swapped and restored.

Used by the ``lpq_plugin`` fixtures and by the conformance suite, which loads only the
adaptor under test (the ``LPQ_LOAD_PLUGINS`` allow list) so that a broken, unrelated
plugin in the same environment fails its own check and not every check of the adaptor.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from lpq.plugins import manager as _manager_module
from lpq.plugins.discovery import ENV_ALLOW, ENV_DENY, ENV_STRICT, PluginRecord, PluginStatus
from lpq.plugins.manager import PluginManager


@contextmanager
def fresh_plugin_manager() -> Iterator[PluginManager]:
    """A new process-wide manager for the block; the previous one is restored after."""
    saved = _manager_module._manager
    _manager_module.reset_plugin_manager()
    try:
        yield _manager_module.get_plugin_manager()
    finally:
        _manager_module._manager = saved


@contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def survey_plugins() -> tuple[list[PluginRecord], dict[str, str | None]]:
    """Load every installed plugin leniently (never strict) in a private manager.

    Returns the plugin records and, per framework, the plugin that provides it.
    """
    with _environment(**{ENV_STRICT: None, ENV_ALLOW: None, ENV_DENY: None}):
        manager = PluginManager()
        records = manager.records()
    owners = {framework: manager.adaptors.owner(framework) for framework in manager.adaptors}
    return records, owners


def broken(records: list[PluginRecord]) -> list[PluginRecord]:
    """Records of plugins that failed to load (error or incompatible)."""
    return [r for r in records if r.status in (PluginStatus.ERROR, PluginStatus.INCOMPATIBLE)]
