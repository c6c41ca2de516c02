"""scripts/test.sh runs every suite even when one fails and exits non-zero if any failed;
MXNet's "no tests selected" (exit 5) is not a failure (issue 29, item 10). Run in a
sandbox whose tools are stubs that exit with chosen codes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _sandbox(tmp_path: Path, codes: dict[str, int]) -> Path:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", root / "scripts" / "test.sh")
    (root / "scripts" / "setup.sh").write_text("exit 0\n")
    log = root / "ran.log"
    for venv, tool in [(".venv", "ruff"), (".venv", "mypy"), (".venv", "python"),
                       (".venv-mxnet", "python")]:  # fmt: skip
        path = root / venv / "bin" / tool
        path.parent.mkdir(parents=True, exist_ok=True)
        key = f"{venv}/{tool}"
        path.write_text(f'#!/bin/sh\necho {key} >> "{log}"\nexit {codes.get(key, 0)}\n')
        path.chmod(0o755)
    return root


@pytest.mark.parametrize(
    ("codes", "failed"),
    [
        ({}, None),
        ({".venv/ruff": 1, ".venv/python": 1}, ["ruff", "pytest (exit 1)"]),
        ({".venv-mxnet/python": 5}, None),
        ({".venv-mxnet/python": 2}, ["pytest (mxnet)"]),
    ],
    ids=["all-pass", "two-fail", "mxnet-none-selected", "mxnet-fails"],
)
def test_every_suite_runs_and_any_failure_fails_the_script(tmp_path, codes, failed):
    root = _sandbox(tmp_path, codes)
    done = subprocess.run(
        ["bash", "scripts/test.sh"], cwd=root, capture_output=True, text=True, timeout=60
    )
    ran = (root / "ran.log").read_text().split()
    assert ran == [".venv/ruff", ".venv/mypy", ".venv/python", ".venv-mxnet/python"]
    if failed is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0
        for name in failed:
            assert name in done.stderr
