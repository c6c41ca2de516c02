"""lpq's test kit for plugin authors: the ``lpq_plugin`` fixture and its isolation.

The kit is exercised the way a plugin author uses it: an inner pytest session in a
subprocess, with lpq's pytest plugin auto-loaded from its ``pytest11`` entry point.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import lpq

INNER_TESTS = """
import lpq


class ToyPlugin:
    @lpq.hookimpl
    def lpq_register_adaptors(self, register):
        register(lpq.AdaptorInfo("toyfw", "toyfw-runtime", []))

    @lpq.hookimpl
    def lpq_register_metrics(self, register):
        register("toy_metric", lambda: "metric instance")

    @lpq.hookimpl
    def lpq_detect_framework(self, model):
        return "toyfw" if model == "toy-model" else None


def test_a_registers_the_plugin(lpq_plugin):
    pm = lpq_plugin(ToyPlugin(), name="toy")
    assert pm is lpq.get_plugin_manager()
    assert pm.detect_framework("toy-model") == "toyfw"
    assert pm.adaptor("toyfw").framework_distribution == "toyfw-runtime"
    assert pm.create_metric("toy_metric") == "metric instance"
    assert "toy" in [r.name for r in pm.records()]


def test_b_does_not_see_it():
    pm = lpq.get_plugin_manager()
    assert "toyfw" not in {**pm.adaptors}
    try:
        pm.detect_framework("toy-model")
    except lpq.NoAdaptorError:
        pass
    else:
        raise AssertionError("the plugin of test_a leaked into test_b")
    assert "toy" not in [r.name for r in pm.records()]


def test_c_registers_it_again(lpq_plugin):
    pm = lpq_plugin(ToyPlugin(), name="toy")
    assert pm.detect_framework("toy-model") == "toyfw"
"""


def run_inner_session(folder: Path, source: str) -> tuple[dict[str, int], str]:
    """Run ``source`` as a test file in a fresh pytest process; outcome counts + output."""
    (folder / "test_kit.py").write_text(source)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_kit.py"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = result.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error)", summary)}
    return counts, result.stdout


def test_lpq_plugin_registers_for_one_test_only(tmp_path: Path):
    counts, output = run_inner_session(tmp_path, INNER_TESTS)
    assert counts == {"passed": 3}, output


def test_inner_session_catches_a_leak(tmp_path: Path):
    """Control: registering on the process-wide manager (no fixture) does leak, and the
    inner test_b above notices it, so its passing is meaningful."""
    leaky = INNER_TESTS.replace(
        "def test_a_registers_the_plugin(lpq_plugin):\n"
        '    pm = lpq_plugin(ToyPlugin(), name="toy")\n    assert pm is lpq.get_plugin_manager()',
        "def test_a_registers_the_plugin():\n    pm = lpq.get_plugin_manager()\n"
        '    pm.load()\n    pm.register(ToyPlugin(), name="toy")',
    )
    assert leaky != INNER_TESTS
    counts, output = run_inner_session(tmp_path, leaky)
    assert counts == {"passed": 2, "failed": 1}, output
    assert "FAILED test_kit.py::test_b_does_not_see_it" in output


def test_fixture_restores_the_previous_manager(lpq_plugin_manager):
    assert lpq_plugin_manager is lpq.get_plugin_manager()
    assert lpq_plugin_manager.records() is not None


def test_same_name_twice_is_an_error(lpq_plugin, tmp_path: Path, monkeypatch):
    monkeypatch.delenv("LPQ_PLUGINS_STRICT", raising=False)

    class Adaptor:
        @lpq.hookimpl
        def lpq_register_adaptors(self, register):
            register(lpq.AdaptorInfo("dupfw", "dupfw", []))

    pm = lpq_plugin(Adaptor(), name="first")
    pm = lpq_plugin(Adaptor(), name="second")
    records = {r.name: r for r in pm.records()}
    assert records["first"].status.value == "ok"
    assert records["second"].status.value == "error"
    assert "adaptor 'dupfw' is already registered by plugin 'first'" in records["second"].message


def test_registration_hook_failure_is_isolated(lpq_plugin, monkeypatch):
    monkeypatch.delenv("LPQ_PLUGINS_STRICT", raising=False)

    class Exploding:
        @lpq.hookimpl
        def lpq_register_metrics(self, register):
            raise ValueError("metric table is corrupt")

    pm = lpq_plugin(Exploding(), name="exploding")
    record = {r.name: r for r in pm.records()}["exploding"]
    assert record.status.value == "error"
    assert "registration failed: ValueError: metric table is corrupt" in record.message
    assert pm._pm.get_plugin("exploding") is None
    assert pm.create_metric("top1").name == "top1", "built-in metrics still work"


def test_registration_hook_failure_raises_in_strict_mode(lpq_plugin, monkeypatch):
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")

    class Exploding:
        @lpq.hookimpl
        def lpq_register_metrics(self, register):
            raise ValueError("metric table is corrupt")

    with pytest.raises(lpq.PluginError, match="metric table is corrupt"):
        lpq_plugin(Exploding(), name="exploding")


def test_conformance_suite_is_exported():
    from lpq.testing import AdaptorConformance

    tests = [name for name in dir(AdaptorConformance) if name.startswith("test_")]
    assert len(tests) >= 8
    assert AdaptorConformance.framework == ""
