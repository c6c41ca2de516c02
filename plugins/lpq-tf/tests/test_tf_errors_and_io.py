"""Model inputs, detection, bad input and save/load of the TensorFlow adaptor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tf_testmodels import calib_loader, config_for, eval_loader, residual_net, top1

import lpq
from lpq_tf import graph
from lpq_tf.plugin import plugin

pm = lpq.get_plugin_manager()


def test_plugin_and_detection_import_no_framework(tmp_path: Path) -> None:
    (tmp_path / "m.tflite").write_bytes(b"\x00\x00\x00\x00TFL3" + bytes(8))
    script = (
        "import sys, lpq_tf.plugin as p\n"
        f"assert p.plugin.lpq_detect_framework({str(tmp_path / 'm.tflite')!r}) == 'tf'\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'ai_edge_litert', 'ai_edge_quantizer')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_detection_of_keras_files_saved_models_and_tflite(cnn: Any, tmp_path: Path) -> None:
    cnn.save(tmp_path / "digits.keras")
    cnn.export(str(tmp_path / "saved"), verbose=False)
    float_file = pm.save_model("tf", cnn, tmp_path / "digits.tflite")
    for model in (cnn, tmp_path / "digits.keras", tmp_path / "saved", float_file):
        assert pm.detect_framework(model) == "tf", model
    # Foreign files with our suffixes, and other adaptors' formats, are declined.
    (tmp_path / "fake.tflite").write_text("not a flatbuffer")
    (tmp_path / "fake.keras").write_text("not a zip")
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07")
    (tmp_path / "empty_dir").mkdir()
    for foreign in ("fake.tflite", "fake.keras", "model.onnx", "empty_dir"):
        assert plugin.lpq_detect_framework(tmp_path / foreign) is None, foreign


def test_keras_file_and_saved_model_quantize_alike(
    cnn: Any, cnn_fp32_accuracy: float, tmp_path: Path
) -> None:
    cnn.save(tmp_path / "digits.keras")
    cnn.export(str(tmp_path / "saved"), verbose=False)
    from_file = pm.query_capability("tf", tmp_path / "digits.keras", None, {})
    assert [name for name, _ in from_file.opwise] == ["conv1", "conv2", "fc1", "logits"]
    saved = pm.query_capability("tf", tmp_path / "saved", None, {})
    # No Keras layers in a SavedModel: ops keep their TFLite scope names.
    assert len(saved.opwise) == 4
    assert any("conv1" in name for name, _ in saved.opwise)
    for model, capability in ((tmp_path / "digits.keras", from_file), (tmp_path / "saved", saved)):
        qmodel = pm.quantize("tf", model, config_for(capability, "int8", "static"), calib_loader())
        assert top1(qmodel) >= cnn_fp32_accuracy - 0.01


def test_ops_are_named_after_default_keras_layer_names() -> None:
    model = residual_net()
    capability = pm.query_capability("tf", model, None, {})
    names = {name: op_type for name, op_type in capability.opwise}
    assert names == {
        "conv2d": "CONV_2D",
        "depthwise_conv2d": "DEPTHWISE_CONV_2D",
        "conv2d_1": "CONV_2D",
        "add": "ADD",
        "global_average_pooling2d": "MEAN",
        "dense": "FULLY_CONNECTED",
    }
    # BatchNormalization and the ReLUs are folded / fused: not ops of their own.
    rng = np.random.default_rng(0)
    data = lpq.ArrayLoader(rng.random((64, 8, 8, 1), dtype=np.float32), batch_size=16)
    qmodel = pm.quantize("tf", model, config_for(capability, "int8", "static", add="fp32"), data)
    found = pm.quantized_ops("tf", qmodel)
    assert found["add"] == "fp32"
    assert {found[n] for n in names if n != "add"} == {"int8"}


def test_not_a_tf_model_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(lpq.ModelError, match="not a TensorFlow model"):
        pm.query_capability("tf", object(), None, {})
    with pytest.raises(lpq.ModelError, match="no such file"):
        pm.query_capability("tf", tmp_path / "missing.tflite", None, {})


def test_an_op_the_converter_rejects_is_named() -> None:
    import keras
    import tensorflow as tf

    class Singular(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            return tf.linalg.svd(x, compute_uv=False)

    inputs = keras.Input((4, 4))
    model = keras.Model(inputs, keras.layers.Dense(3)(Singular()(inputs)))
    with pytest.raises(lpq.ModelError, match=r"tf\.Svd") as error:
        pm.query_capability("tf", model, None, {})
    assert "SELECT_TF_OPS" in str(error.value)


def test_misfit_calibration_data_by_name_is_a_data_error(cnn: Any, cnn_capability: Any) -> None:
    x = np.zeros((4, 8, 8, 1), np.float32)
    with pytest.raises(lpq.DataError, match="do not match"):
        pm.quantize("tf", cnn, config_for(cnn_capability, "int8", "static"), [{"pixels": x}])
    with pytest.raises(lpq.DataError, match="dtype"):
        pm.evaluate("tf", cnn, [(np.zeros((4, 8, 8, 1), np.int64), None)], [lpq.TopK(1)])
    with pytest.raises(lpq.DataError, match="calibration data"):
        pm.quantize("tf", cnn, config_for(cnn_capability, "int8", "static"), None)


def test_unknown_op_and_bf16_in_tune_cfg_are_config_errors(cnn: Any, cnn_capability: Any):
    cfg = lpq.TuneConfig(ops={("nope", "CONV_2D"): lpq.OpConfig.fallback()})
    with pytest.raises(lpq.ConfigError, match="nope"):
        pm.quantize("tf", cnn, cfg, calib_loader())
    bf16 = config_for(cnn_capability, "int8", "static", fc1="bf16")
    with pytest.raises(lpq.ConfigError, match="bf16"):
        pm.quantize("tf", cnn, bf16, calib_loader())


def test_saved_model_keeps_tune_cfg_in_metadata_and_reloads_alone(
    cnn: Any, cnn_capability: Any, tmp_path: Path
) -> None:
    cfg = config_for(cnn_capability, "int8", "static", fc1="fp32")
    qmodel = pm.quantize("tf", cnn, cfg, calib_loader())
    written = pm.save_model("tf", qmodel, tmp_path / "digits-int8")
    assert written == tmp_path / "digits-int8.tflite"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits-int8.tflite"]  # no temp left
    meta = graph.read(written.read_bytes()).metadata
    assert lpq.TuneConfig.from_json(json.loads(meta["lpq.tune_cfg"])) == cfg
    loaded = pm.load_model("tf", written)
    assert loaded.source is None  # rebuilt from the file alone
    assert pm.quantized_ops("tf", loaded) == pm.quantized_ops("tf", qmodel)
    inspected = pm.inspect_tensor("tf", loaded, eval_loader(), ["conv2"], "activation", 1)
    assert inspected.activations["conv2"][0].shape == (100, 8, 8, 32)
    # Any LiteRT runs the file; the metadata changes nothing it computes.
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(written))
    interpreter.allocate_tensors()
    # A float .tflite loads as its path; a damaged file is a ModelError.
    assert pm.load_model("tf", pm.save_model("tf", cnn, tmp_path / "f")) == tmp_path / "f.tflite"
    (tmp_path / "bad.tflite").write_bytes(b"garbage")
    with pytest.raises(lpq.ModelError):
        pm.load_model("tf", tmp_path / "bad.tflite")


def test_quantized_file_is_not_quantized_twice(cnn: Any, cnn_capability: Any, tmp_path: Path):
    qmodel = pm.quantize("tf", cnn, config_for(cnn_capability, "int8", "static"), calib_loader())
    written = pm.save_model("tf", qmodel, tmp_path / "q.tflite")
    with pytest.raises(lpq.ModelError, match="already quantized"):
        pm.query_capability("tf", written, None, {})
