"""Listing plugins, ``lpq --help`` and ``import lpq`` import no deep-learning framework.

Checked with ``python -X importtime``, which logs every module imported by an ``import``
statement, with every plugin of this repo visible and loaded (strict mode, so a plugin
that fails to load fails the test instead of hiding an import). ``importlib.import_module``
(how entry points are loaded) is not logged by ``-X importtime``, so the listing is also
checked against ``sys.modules`` at exit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from core_testutil import FakeSite, repo_plugins

FRAMEWORKS = (
    "torch",
    "torchao",
    "tensorflow",
    "keras",
    "ai_edge_litert",
    "ai_edge_quantizer",
    "onnxruntime",
    "onnx",
    "mxnet",
    "jax",
    "ray",
)


def imported_modules(args: list[str], env: dict[str, str]) -> tuple[set[str], str]:
    """Run ``python -X importtime ARGS``; return the imported module names and stdout."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    modules = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                modules.add(name)
    assert modules, "no -X importtime output to check"
    return modules, result.stdout


LIST_AND_DUMP_MODULES = """
import json, sys
from lpq.cli import main
code = main(["plugins", "list", "--json"])
with open(sys.argv[1], "w") as out:
    json.dump(sorted(sys.modules), out)
sys.exit(code)
"""


def frameworks_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in FRAMEWORKS)


def test_the_checker_sees_imports(all_plugins_site: FakeSite):
    modules, _ = imported_modules(["-c", "import json, email.mime.text"], all_plugins_site.env())
    assert {"json", "email.mime.text"} <= modules
    assert frameworks_in({"onnx.helper", "onnxruntime", "torch", "lpq_onnxrt"}) == [
        "onnx.helper",
        "onnxruntime",
        "torch",
    ]


def test_plugins_list_imports_no_framework(all_plugins_site: FakeSite):
    env = all_plugins_site.env(LPQ_PLUGINS_STRICT="1")
    modules, stdout = imported_modules(["-m", "lpq", "plugins", "list", "--json"], env)
    assert frameworks_in(modules) == []
    rows = {row["name"]: row for row in json.loads(stdout)}
    for plugin in repo_plugins():
        assert rows[plugin.name]["status"] == "ok", rows[plugin.name]
        assert rows[plugin.name]["frameworks"], f"{plugin.name} registered no adaptor"


def test_plugins_list_leaves_no_framework_in_sys_modules(all_plugins_site: FakeSite, tmp_path):
    dump = tmp_path / "modules.json"
    env = all_plugins_site.env(LPQ_PLUGINS_STRICT="1")
    result = subprocess.run(
        [sys.executable, "-c", LIST_AND_DUMP_MODULES, str(dump)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    modules = set(json.loads(dump.read_text()))
    assert frameworks_in(modules) == []
    for plugin in repo_plugins():
        module = plugin.entry_point.partition(":")[0]  # "pkg.plugin" or "pkg.plugin:plugin"
        assert module in modules, f"{plugin.entry_point} was not even imported"


def test_plugins_list_table_imports_no_framework(all_plugins_site: FakeSite):
    env = all_plugins_site.env(LPQ_PLUGINS_STRICT="1")
    modules, stdout = imported_modules(["-m", "lpq", "plugins", "list"], env)
    assert frameworks_in(modules) == []
    for plugin in repo_plugins():
        assert plugin.name in stdout


@pytest.mark.parametrize(
    "args",
    [["-c", "import lpq"], ["-m", "lpq", "--help"], ["-m", "lpq", "--version"]],
    ids=["import-lpq", "help", "version"],
)
def test_entry_points_import_no_framework(all_plugins_site: FakeSite, args: list[str]):
    modules, _ = imported_modules(args, all_plugins_site.env(LPQ_PLUGINS_STRICT="1"))
    assert frameworks_in(modules) == []


def test_import_lpq_does_not_load_plugins(all_plugins_site: FakeSite):
    script = "import sys, lpq; print(' '.join(sorted(sys.modules)))"
    _, stdout = imported_modules(["-c", script], all_plugins_site.env())
    loaded = set(stdout.split())
    for plugin in repo_plugins():
        assert plugin.entry_point.partition(":")[0] not in loaded
    assert "jsonschema" not in loaded, "the schema validator loads on first use"
    assert frameworks_in(loaded) == []


def test_this_repo_has_plugins():
    assert {p.name for p in repo_plugins()} >= {"onnxrt", "torch"}
