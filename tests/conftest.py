"""Shared fixtures for lpq-core's tests.

Most plugin tests need *installed distributions*, not just plugin objects, because
discovery reads entry-point metadata. :func:`fake_site` builds them cheaply and for real:
a ``<name>.dist-info`` folder (``METADATA`` + ``entry_points.txt``) and a module in a
temporary directory, which ``importlib.metadata`` discovers exactly like a pip install
once the directory is on ``sys.path`` (in-process) or ``PYTHONPATH`` (subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

from lpq import discovery
from lpq import manager as manager_module

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]

#: Module source of a well-behaved plugin; ``{framework}`` is substituted.
GOOD_PLUGIN = """\
import lpq


@lpq.hookimpl
def lpq_register_adaptors(register):
    register(lpq.AdaptorInfo("{framework}", "{framework}-runtime", []))


@lpq.hookimpl
def lpq_detect_framework(model):
    return "{framework}" if model == "{framework}-model" else None
"""

RAISING_PLUGIN = 'raise RuntimeError("toy plugin exploded while importing")\n'

#: ``colour`` is not a parameter of the ``lpq_register_adaptors`` spec.
WRONG_SIGNATURE_PLUGIN = """\
import lpq


@lpq.hookimpl
def lpq_register_adaptors(register, colour):
    raise AssertionError("never called: registration must fail validation first")
"""


@dataclass
class FakeSite:
    """A directory of fake installed distributions."""

    path: Path
    modules: list[str] = field(default_factory=list)
    #: Further ``PYTHONPATH`` entries for subprocesses (plugin source folders).
    extra_paths: list[str] = field(default_factory=list)

    def add(
        self,
        dist: str,
        plugin: str,
        source: str,
        *,
        module: str | None = None,
        requires_core: str | None = ">=0.1",
        version: str = "1.0",
    ) -> str:
        """Install distribution ``dist`` whose entry point ``plugin`` is a module with
        ``source``; returns the module name."""
        module = module or f"{dist.replace('-', '_')}_plugin"
        (self.path / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        metadata = [
            "Metadata-Version: 2.1",
            f"Name: {dist}",
            f"Version: {version}",
        ]
        if requires_core is not None:
            metadata.append(f"Requires-Dist: lpq-core{requires_core}")
        metadata.append("Requires-Dist: pytest; extra == 'test'")
        (info / "METADATA").write_text("\n".join(metadata) + "\n")
        (info / "entry_points.txt").write_text(f"[lpq]\n{plugin} = {module}\n")
        self.modules.append(module)
        return module

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that sees these distributions."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LPQ_")}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.path), *self.extra_paths, env.get("PYTHONPATH", "")) if p
        )
        env.update(extra)
        return env


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


@dataclass(frozen=True)
class RepoPlugin:
    """A plugin distribution of this repo, read from its ``pyproject.toml``."""

    distribution: str
    name: str
    entry_point: str
    folder: Path

    @property
    def installed(self) -> bool:
        try:
            dist = metadata.distribution(self.distribution)
        except metadata.PackageNotFoundError:
            return False
        return any(ep.group == "lpq" and ep.name == self.name for ep in dist.entry_points)


def repo_plugins() -> list[RepoPlugin]:
    """Every plugin of ``plugins/*`` that has a ``pyproject.toml`` with an lpq entry point."""
    found = []
    for pyproject in sorted(REPO.glob("plugins/*/pyproject.toml")):
        dist, entry_points = _read_pyproject(pyproject.read_text())
        for name, value in entry_points.items():
            found.append(RepoPlugin(dist, name, value, pyproject.parent))
    return found


def _read_pyproject(text: str) -> tuple[str, dict[str, str]]:
    """The project name and the ``lpq`` entry points of a ``pyproject.toml`` (a tiny
    reader for these two keys, since ``tomllib`` needs Python 3.11)."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            current = line.strip("[]").strip()
        elif "=" in line and current:
            key, value = (part.strip() for part in line.split("=", 1))
            sections.setdefault(current, {})[key.strip('"')] = value.strip('"')
    return sections["project"]["name"], sections.get("project.entry-points.lpq", {})


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
