"""lpq-mxnet without a working MXNet: listed honestly, and an lpq error saying what to
install when used. Runs in both environments: scripts/test.sh also runs this module in
the main .venv, where lpq-mxnet is installed without MXNet (and with numpy 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lpq_mxnet.framework import numpy_too_new

#: Run first in a subprocess: makes ``import mxnet`` fail as if MXNet were not installed.
BLOCK_MXNET = "import sys\nsys.modules['mxnet'] = None\n"


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def plugin_error_message(code: str) -> str:
    """Run ``code`` (which must raise lpq.PluginError) in a subprocess; the message."""
    wrapped = "import lpq\ntry:\n" + "".join(f"    {line}\n" for line in code.splitlines())
    wrapped += "except lpq.PluginError as exc:\n    print(exc)\nelse:\n    raise SystemExit(1)\n"
    result = run(wrapped)
    assert result.returncode == 0, result.stderr[-2000:] or "no PluginError"
    return result.stdout


def test_registering_and_detecting_import_no_mxnet() -> None:
    code = (
        "import sys, lpq\n"
        "from lpq_mxnet.plugin import plugin as p\n"
        "seen = []\n"
        "p.lpq_register_adaptors(seen.append)\n"
        "assert seen[0].framework == 'mxnet', seen\n"
        "assert p.lpq_detect_framework(object()) is None\n"
        "assert p.lpq_detect_framework('model.onnx') is None\n"
        "assert p.lpq_query_fw_capability('onnxrt', None, None, {}) is None\n"
        "assert 'mxnet' not in sys.modules, 'mxnet was imported'\n"
    )
    result = run(code)
    assert result.returncode == 0, result.stderr[-2000:]


def test_plugins_list_shows_the_plugin_ok_without_mxnet() -> None:
    code = BLOCK_MXNET + (
        "from lpq.cli import main\nraise SystemExit(main(['plugins', 'list', '--json']))\n"
    )
    result = run(code)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["mxnet"]["status"] == "ok"
    assert rows["mxnet"]["frameworks"][0]["framework"] == "mxnet"


def test_using_it_without_mxnet_says_what_to_install() -> None:
    message = plugin_error_message(
        BLOCK_MXNET
        + "lpq.get_plugin_manager().quantize('mxnet', object(), lpq.TuneConfig(), [[0]])"
    )
    assert "needs MXNet" in message
    assert "pip install 'lpq-mxnet[mxnet]'" in message


def test_numpy_too_new_for_mxnet_says_what_to_install() -> None:
    # As if MXNet 1.9.1 were installed beside numpy 2 (the main environment's numpy).
    message = plugin_error_message(
        "import numpy\n"
        "lpq.installed_version = lambda dist: '1.9.1'\n"
        "numpy.__version__ = '2.4.6'\n"
        "from lpq_mxnet.framework import mxnet\n"
        "mxnet()"
    )
    assert "cannot be imported with numpy 2.4.6 (it needs numpy<1.24)" in message
    assert "lpq-mxnet[mxnet]" in message


@pytest.mark.parametrize(
    ("version", "too_new"),
    [("1.23.5", False), ("1.22.0", False), ("1.24.0", True), ("1.26.4", True), ("2.4.6", True)],
)
def test_numpy_version_guard(version: str, too_new: bool) -> None:
    assert numpy_too_new(version) is too_new
