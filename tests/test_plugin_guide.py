"""The plugin author's guide's own files build cleanly (issue 11, item 17): the
``pyproject.toml`` template of docs/writing-a-plugin.md, with its capability YAML and its
``plugin.py``, builds a wheel without a single setuptools warning, and the wheel carries
the YAML."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from core_testutil import REPO

GUIDE = REPO / "docs" / "writing-a-plugin.md"


def guide_block(heading: str, language: str) -> str:
    """The first ``language`` code block after ``heading`` in the guide."""
    text = GUIDE.read_text()
    start = text.index(heading)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert match, f"no {language} block after {heading!r}"
    return match.group(1)


def test_the_pyproject_template_builds_a_wheel_without_warnings(tmp_path: Path):
    project = tmp_path / "lpq-acme"
    (project / "lpq_acme" / "capabilities").mkdir(parents=True)
    (project / "pyproject.toml").write_text(guide_block("### `pyproject.toml`", "toml"))
    (project / "lpq_acme" / "__init__.py").write_text("")
    (project / "lpq_acme" / "plugin.py").write_text(
        guide_block("### `lpq_acme/plugin.py`", "python")
    )
    (project / "lpq_acme" / "capabilities" / "acme.yaml").write_text(
        guide_block("### `lpq_acme/capabilities/acme.yaml`", "yaml")
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            "-c",
            "from setuptools import build_meta; build_meta.build_wheel('dist')",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    warnings = [line for line in output.splitlines() if "warn" in line.lower()]
    assert warnings == [], "\n".join(warnings)
    wheel = next((project / "dist").glob("*.whl"))
    assert "lpq_acme/capabilities/acme.yaml" in zipfile.ZipFile(wheel).namelist()
