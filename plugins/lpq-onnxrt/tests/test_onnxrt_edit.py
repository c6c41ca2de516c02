"""The optional hooks on ONNX models: lpq_set_tensor, lpq_quantize_input, lpq_convert —
through the plugin manager, on the quantized digits CNN, run in ONNX Runtime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import lpq


@pytest.fixture(scope="module")
def digits() -> tuple[lpq.Example, object, np.ndarray]:
    example = lpq.get_plugin_manager().example("digits")
    calib = lpq.load_npz(example.calib)
    conf = lpq.PostTrainingQuantConfig(latency_aware=False)
    quantized = lpq.quantize(str(example.model), conf, calib).model
    with np.load(example.eval) as data:
        inputs = data[next(f for f in data.files if f != "labels")][:16]
    return example, quantized, inputs


def initializers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}


def run(proto: onnx.ModelProto, inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: inputs})[0]


def test_set_tensor_requantizes_a_quantized_weight_with_its_own_scale(digits):
    _, quantized, inputs = digits
    pm = lpq.get_plugin_manager()
    before = initializers(quantized.proto)
    scale = before["fc1.weight_scale"].reshape(-1, 1).astype(np.float64)
    current = before["fc1.weight_quantized"] * scale
    wanted = current * 0.5 + np.random.default_rng(0).uniform(-0.2, 0.2, current.shape) * scale
    edited = pm.set_tensor("onnxrt", quantized, "fc1.weight", wanted)
    after = initializers(edited.proto)
    assert np.max(np.abs(after["fc1.weight_quantized"] * scale - wanted) / scale) <= 0.5 + 1e-9
    assert np.array_equal(after["fc1.weight_scale"], before["fc1.weight_scale"])
    assert not np.array_equal(run(edited.proto, inputs), run(quantized.proto, inputs))
    assert np.array_equal(
        initializers(quantized.proto)["fc1.weight_quantized"], before["fc1.weight_quantized"]
    ), "the caller's model is untouched"


def test_set_tensor_on_a_bias_and_on_the_fp32_model(digits):
    example, quantized, _ = digits
    pm = lpq.get_plugin_manager()
    edited = pm.set_tensor("onnxrt", quantized, "conv1.bias", np.full(32, 0.25))
    ints = initializers(edited.proto)
    bias = ints["conv1.bias_quantized"] * ints["conv1.bias_quantized_scale"]
    assert np.allclose(bias, 0.25, atol=np.max(ints["conv1.bias_quantized_scale"]))
    fp32 = pm.set_tensor("onnxrt", str(example.model), "fc2.bias", np.zeros(10, np.float32))
    assert np.array_equal(initializers(fp32)["fc2.bias"], np.zeros(10, np.float32))
    with pytest.raises(lpq.ModelError, match="no weight or bias tensor named 'nope'"):
        pm.set_tensor("onnxrt", quantized, "nope", np.zeros(1))
    with pytest.raises(lpq.ModelError, match="shape"):
        pm.set_tensor("onnxrt", quantized, "conv1.bias", np.zeros(3))


def test_quantize_input_takes_integers_and_gives_the_same_outputs(digits):
    _, quantized, inputs = digits
    pm = lpq.get_plugin_manager()
    integer = pm.quantize_input("onnxrt", quantized, {"inputs": True, "outputs": False})
    params = json.loads(
        next(p.value for p in integer.proto.metadata_props if p.key == "lpq.io.input")
    )
    assert params["dtype"] == "uint8"
    as_ints = np.clip(np.rint(inputs / params["scale"]) + params["zero_point"], 0, 255)
    got = run(integer.proto, as_ints.astype(np.uint8))
    assert np.array_equal(got, run(quantized.proto, inputs))
    with pytest.raises(lpq.ModelError, match="output 'logits' is computed in float"):
        pm.quantize_input("onnxrt", quantized, {"inputs": True, "outputs": True})


def test_convert_to_onnx_and_an_unknown_target(digits):
    _, quantized, inputs = digits
    pm = lpq.get_plugin_manager()
    proto = pm.convert("onnxrt", quantized, "onnx")
    assert isinstance(proto, onnx.ModelProto)
    assert np.array_equal(run(proto, inputs), run(quantized.proto, inputs))
    with pytest.raises(lpq.ModelError, match="targets it offers: onnx"):
        pm.convert("onnxrt", quantized, "tensorrt-engine")
