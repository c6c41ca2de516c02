"""Helpers shared by lpq-core's tests (fixtures live in ``conftest.py``).

Most plugin tests need *installed distributions*, not just plugin objects, because
discovery reads entry-point metadata. :class:`FakeSite` builds them cheaply and for real:
a ``<name>.dist-info`` folder (``METADATA`` + ``entry_points.txt``) and a module in a
temporary directory, which ``importlib.metadata`` discovers exactly like a pip install
once the directory is on ``sys.path`` (in-process) or ``PYTHONPATH`` (subprocess).

A module with a unique name rather than ``conftest``: the plugins' test folders have
their own ``conftest.py``, and pytest runs them all in one session.
"""

from __future__ import annotations

import os
import textwrap
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

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
    """The project name and the ``lpq`` entry points of a ``pyproject.toml``."""
    data = tomllib.loads(text)
    project = data["project"]
    return project["name"], project.get("entry-points", {}).get("lpq", {})


#: A valid one-block capability file that tests edit line by line.
VALID = """\
- version:
    name: '1.30'
  precisions: [int8, uint8, fp32]
  ops:
    int8: [Conv, MatMul]
    fp32: ['*']
  capabilities:
    int8:
      static:
        Conv:
          weight:
            dtype: [int8]
            scheme: [sym]
            granularity: [per_channel, per_tensor]
          activation:
            dtype: [uint8]
            scheme: [asym]
            algorithm: [minmax, kl]
  algorithms: [minmax, kl, percentile]
"""


def fit_fake(model: Any, conf: Any, tmp_path: Path) -> Any:
    """``lpq.fit`` of a fake adaptor's model: one calibration batch, and 1000 labelled
    evaluation samples (the fake's accuracy is scored on them)."""
    import numpy as np

    import lpq

    return lpq.fit(
        model,
        conf,
        [np.zeros((4, 1), np.float32)],
        eval_dataloader=[(np.zeros((1000, 1), np.float32), np.arange(1000) % 10)],
        workspace=tmp_path / "ws",
    )


# --------------------------------------------------------------------------- examples/


def example_project(example: Path) -> dict[str, Any]:
    """The ``[project]`` table of an example plugin under ``examples/``."""
    project: dict[str, Any] = tomllib.loads((example / "pyproject.toml").read_text())["project"]
    return project


def add_example_distribution(site: FakeSite, example: Path) -> None:
    """Write ``example``'s real metadata (name, version, requirements, ``lpq`` entry
    points) into ``site`` as an installed distribution; the caller puts its folder on
    the path."""
    project = example_project(example)
    name, version = project["name"], project["version"]
    info = site.path / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    requires = "".join(f"Requires-Dist: {r}\n" for r in project["dependencies"])
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}"
    )
    entry_points = "".join(f"{k} = {v}\n" for k, v in project["entry-points"]["lpq"].items())
    (info / "entry_points.txt").write_text(f"[lpq]\n{entry_points}")


@dataclass
class WheelContents:
    names: list[str]
    entry_points: str
    requires: list[Any]  # packaging Requirements from Requires-Dist


def build_example_wheel(example: Path, tmp_path: Path) -> WheelContents:
    """Build ``example``'s wheel (from a copy: building leaves build/ and *.egg-info behind)
    offline, and read back its files, entry points and requirements."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from packaging.requirements import Requirement

    source = tmp_path / "src"
    shutil.copytree(example, source, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"),
            *("wheel", "--no-deps", "--no-build-isolation", "--no-index"),
            *("-w", str(tmp_path), str(source)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    distribution = example_project(example)["name"].replace("-", "_")
    (wheel,) = tmp_path.glob(f"{distribution}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        metadata_file = next(n for n in names if n.endswith("METADATA"))
        requires = [
            Requirement(line.removeprefix("Requires-Dist: "))
            for line in archive.read(metadata_file).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
        return WheelContents(names, archive.read(entry_points).decode(), requires)
