"""Errors about plugins and models point the right way (issue 11, items 10, 16, 17).

"no installed plugin recognises the model ... pip install lpq-onnxrt" was the answer to
everything, also when lpq-onnxrt was installed. Each case now gets its own message.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from core_testutil import GOOD_PLUGIN, RAISING_PLUGIN, FakeSite

import lpq
from lpq.errors import LpqWarning
from lpq.plugins import manager as manager_module


def detect_error(model: object) -> lpq.LpqError:
    with pytest.raises(lpq.LpqError) as info:
        lpq.get_plugin_manager().detect_framework(model)
    return info.value


def test_missing_file_through_the_python_api(fake_site: FakeSite, tmp_path: Path):
    with pytest.raises(lpq.NoAdaptorError, match="does not exist") as info:
        lpq.quantize(tmp_path / "missing.onnx")
    assert "pip install" not in str(info.value)


def test_text_file_with_the_onnx_suffix(fake_site: FakeSite, tmp_path: Path):
    fake = tmp_path / "notes.onnx"
    fake.write_text("hello, not a model")
    error = detect_error(fake)
    assert isinstance(error, lpq.NoAdaptorError)
    assert "onnxrt adaptor does not recognise its contents as an ONNX model" in error.message
    assert "pip install" not in str(error)
    assert "--framework onnxrt" in (error.hint or "")


def test_disabled_plugin_is_named(fake_site: FakeSite, tmp_path: Path, monkeypatch):
    from lpq_onnxrt.examples import digits_example

    monkeypatch.setenv("LPQ_DISABLE_PLUGINS", "onnxrt")
    error = detect_error(digits_example()["model"])
    assert "looks like an ONNX model" in error.message
    assert "disabled by LPQ_DISABLE_PLUGINS" in error.message
    assert error.hint == "remove onnxrt from LPQ_DISABLE_PLUGINS"
    with pytest.raises(lpq.NoAdaptorError, match="installed but disabled by LPQ_DISABLE_PLUGINS"):
        lpq.get_plugin_manager().adaptor("onnxrt")


@pytest.mark.parametrize(
    ("name", "looks_like", "plugin"),
    [
        ("frozen.pb", "a TensorFlow graph", "lpq-tf"),
        ("model.tflite", "a TensorFlow Lite model", "lpq-tf"),
        ("net-symbol.json", "an MXNet model", "lpq-mxnet"),
    ],
)
def test_other_frameworks_files_say_which_plugin(
    fake_site: FakeSite, tmp_path: Path, monkeypatch, name: str, looks_like: str, plugin: str
):
    monkeypatch.setenv("LPQ_LOAD_PLUGINS", "onnxrt,torch")  # whatever else is installed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LpqWarning)
        file = tmp_path / name
        file.write_bytes(b"\0" * 16)
        error = detect_error(file)
    assert looks_like in error.message
    if plugin.removeprefix("lpq-") in {r.name for r in lpq.get_plugin_manager().records()}:
        assert "disabled by LPQ_LOAD_PLUGINS" in error.message  # installed here
        assert f"add {plugin.removeprefix('lpq-')} to LPQ_LOAD_PLUGINS" == error.hint
    else:
        assert f"pip install {plugin}" in (error.hint or "")
    assert "lpq-onnxrt" not in str(error)


def test_a_broken_plugin_for_the_format_is_named(fake_site: FakeSite, tmp_path: Path, monkeypatch):
    fake_site.add("lpq-tf", "tf", RAISING_PLUGIN)
    monkeypatch.setenv("LPQ_LOAD_PLUGINS", "tf")
    model = tmp_path / "m.tflite"
    model.write_bytes(b"\0" * 16)
    error = detect_error(model)
    assert "the 'tf' plugin that handles it did not load" in error.message
    assert "toy plugin exploded while importing" in error.message


def test_unknown_object_lists_what_adaptors_read(fake_site: FakeSite, monkeypatch):
    monkeypatch.setenv("LPQ_LOAD_PLUGINS", "onnxrt")
    error = detect_error(object())
    assert "no installed plugin recognises the model a builtins.object object" in error.message
    assert ".onnx (onnxrt)" in (error.hint or "")


def test_unknown_names_in_the_plugin_lists_warn(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    monkeypatch.setenv("LPQ_LOAD_PLUGINS", "toy,tyo")
    monkeypatch.setenv("LPQ_DISABLE_PLUGINS", "onnxrtt")
    with pytest.warns(LpqWarning) as caught:
        lpq.get_plugin_manager().records()
    texts = sorted(str(w.message) for w in caught)
    assert texts[0].startswith("LPQ_DISABLE_PLUGINS names 'onnxrtt', which is not an installed")
    assert texts[1].startswith("LPQ_LOAD_PLUGINS names 'tyo', which is not an installed plugin")


def test_the_cli_prints_the_warning_as_one_line(fake_site: FakeSite, run_lpq):
    result = run_lpq("plugins", "list", "--json", env=fake_site.env(LPQ_DISABLE_PLUGINS="nope"))
    assert result.returncode == 0
    assert result.stderr.startswith("warning: LPQ_DISABLE_PLUGINS names 'nope'")
    assert "UserWarning" not in result.stderr and "discovery.py" not in result.stderr


def test_json_listing_states_an_import_error_once(fake_site: FakeSite, run_lpq):
    fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    result = run_lpq("plugins", "list", "--json", env=fake_site.env(LPQ_LOAD_PLUGINS="broken"))
    row = next(r for r in json.loads(result.stdout) if r["name"] == "broken")
    assert row["message"] == "import failed: RuntimeError: toy plugin exploded while importing"


def test_strict_mode_raises_on_every_call(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    monkeypatch.setenv("LPQ_LOAD_PLUGINS", "broken")
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")
    for _ in range(3):
        with pytest.raises(lpq.PluginError, match="toy plugin exploded"):
            lpq.get_plugin_manager().records()
    with pytest.raises(lpq.PluginError, match="toy plugin exploded"):
        lpq.get_plugin_manager()
    assert manager_module._manager is not None


def test_npz_data_is_not_taken_for_a_model(fake_site: FakeSite, tmp_path: Path):
    data = tmp_path / "calib.npz"
    np.savez(data, input=np.zeros((2, 3), np.float32))
    error = detect_error(data)
    assert isinstance(error, lpq.NoAdaptorError)
    assert "installed adaptors read:" in (error.hint or "")
