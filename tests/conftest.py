"""Fixtures for lpq-core's tests; the helpers they use live in ``core_testutil``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The helpers module sits beside this file; make it importable under every pytest import
# mode (``importlib`` mode does not put test folders on sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from core_testutil import FakeSite, repo_plugins

from lpq.plugins import discovery
from lpq.plugins import manager as manager_module


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    """Fake distributions visible to this process, with a fresh plugin manager.

    Undoes everything afterwards: ``sys.path``, imported plugin modules, the cached
    entry-point metadata and the process-wide manager.
    """
    site = FakeSite(tmp_path / "site")
    site.path.mkdir()
    monkeypatch.syspath_prepend(str(site.path))
    for variable in (discovery.ENV_ALLOW, discovery.ENV_DENY, discovery.ENV_STRICT):
        monkeypatch.delenv(variable, raising=False)
    saved_manager = manager_module._manager
    manager_module.reset_plugin_manager()
    discovery.clear_cache()
    try:
        yield site
    finally:
        for module in site.modules:
            sys.modules.pop(module, None)
        manager_module._manager = saved_manager
        discovery.clear_cache()


@pytest.fixture
def run_lpq() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m lpq ARGS`` in a subprocess and return the completed process."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lpq", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    return run


@pytest.fixture
def all_plugins_site(fake_site: FakeSite) -> FakeSite:
    """A site where every plugin of this repo is visible: the installed ones as they are,
    the others from their source folder with fake metadata (so that framework-free checks
    cover every plugin even in a partial environment)."""
    for plugin in repo_plugins():
        if plugin.installed:
            continue
        info = fake_site.path / f"{plugin.distribution.replace('-', '_')}-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {plugin.distribution}\nVersion: 0.0\n"
        )
        (info / "entry_points.txt").write_text(f"[lpq]\n{plugin.name} = {plugin.entry_point}\n")
        fake_site.extra_paths.append(str(plugin.folder))
    return fake_site
