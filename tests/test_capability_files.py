"""Every capability YAML this repo ships validates, and ``lpq capability`` on the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core_testutil import REPO, VALID, FakeSite

import lpq

SHIPPED = sorted(
    path
    for path in REPO.glob("plugins/*/**/*.yaml")
    if "capabilities" in path.parts and not any(part.endswith(".egg-info") for part in path.parts)
)


def test_the_repo_ships_capability_files():
    frameworks = {path.parts[len(REPO.parts) + 1] for path in SHIPPED}
    assert {"lpq-onnxrt", "lpq-torch"} <= frameworks, SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_capability_file_validates(path: Path):
    assert lpq.validate_capability_file(path) >= 1


def test_installed_adaptors_capability_files_validate_and_load():
    pm = lpq.get_plugin_manager()
    pm.load()
    assert pm.adaptors, "the test environment has this repo's adaptors installed"
    for framework, info in pm.adaptors.items():
        assert info.capability_files, f"{framework} names no capability file"
        for file in info.capability_files:
            assert Path(file).is_file(), f"{framework}: {file} is not in the installed package"
            lpq.validate_capability_file(file)
        version = lpq.installed_version(info.framework_distribution)
        spec = lpq.load_capability(info.capability_files, framework, version)
        assert spec.quantizable_op_types(), f"{framework}: no quantizable op for {version}"


# --------------------------------------------------------------------------- CLI


def test_cli_validate_good_files(tmp_path: Path, run_lpq):
    good = tmp_path / "good.yaml"
    good.write_text(VALID)
    result = run_lpq("capability", "validate", str(good), *map(str, SHIPPED))
    assert result.returncode == 0, result.stderr
    assert f"ok   {good} (1 version block)" in result.stdout
    assert result.stdout.count("ok   ") == 1 + len(SHIPPED)


def test_cli_validate_bad_file_fails_without_traceback(tmp_path: Path, run_lpq):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(VALID)
    bad.write_text(VALID.replace("scheme: [sym]", "scheme: [symmetric]"))
    result = run_lpq("capability", "validate", str(bad), str(good))
    assert result.returncode != 0
    assert f"ok   {good}" in result.stdout, "the other files are still checked"
    assert f"{bad}:13: at $[0].capabilities.int8.static.Conv.weight.scheme[0]" in result.stderr
    assert "'symmetric' is not allowed" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_validate_missing_and_empty_files(tmp_path: Path, run_lpq):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    result = run_lpq("capability", "validate", str(empty), str(tmp_path / "missing.yaml"))
    assert result.returncode != 0
    assert "the file is empty" in result.stderr and "file not found" in result.stderr
    assert "Traceback" not in result.stderr


PLUGIN_WITH_CAPABILITY = """\
from pathlib import Path

import lpq

HERE = Path(__file__).parent


@lpq.hookimpl
def lpq_register_adaptors(register):
    register(lpq.AdaptorInfo("toyfw", "toyfw-runtime", [HERE / "toyfw.yaml"]))
"""


def test_cli_show_picks_the_block_for_a_framework_version(fake_site: FakeSite, run_lpq):
    two_blocks = VALID + VALID.replace("'1.30'", "default").replace("[minmax, kl]", "[minmax]")
    (fake_site.path / "toyfw.yaml").write_text(two_blocks)
    fake_site.add("lpq-toy", "toy", PLUGIN_WITH_CAPABILITY)
    env = fake_site.env(LPQ_LOAD_PLUGINS="toy", LPQ_PLUGINS_STRICT="1")
    shown = {}
    for version in ("1.31.2", "1.29"):
        result = run_lpq(
            "capability", "show", "toyfw", "--framework-version", version, "--json", env=env
        )
        assert result.returncode == 0, result.stderr
        shown[version] = json.loads(result.stdout)
    assert shown["1.31.2"]["version_block"] == "1.30"
    assert shown["1.29"]["version_block"] == "default"
    conv = shown["1.31.2"]["ops"][0]
    assert (conv["op_type"], conv["precision"], conv["mode"]) == ("Conv", "int8", "static")
    assert "minmax/kl" in conv["activation"]
    assert "kl" not in shown["1.29"]["ops"][0]["activation"]


def test_cli_show_unknown_framework_is_a_clear_error(fake_site: FakeSite, run_lpq):
    result = run_lpq("capability", "show", "nosuchfw", env=fake_site.env())
    assert result.returncode != 0
    assert "no installed plugin provides the 'nosuchfw' framework" in result.stderr
    assert "Traceback" not in result.stderr
