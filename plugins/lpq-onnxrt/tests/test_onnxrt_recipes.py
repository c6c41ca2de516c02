"""Accuracy recipes against numpy references: CLE and SmoothQuant keep fp32 outputs,
bias correction removes the mean error int8 weights add."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpq
from lpq_onnxrt import model_io, recipes

FW = "onnxrt"


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)[0]


def _model(nodes: list[Any], inits: dict[str, np.ndarray], x_shape: list[Any], y_shape: list[Any]):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape or ["N"])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _conv_pair(depthwise: bool = False) -> onnx.ModelProto:
    """conv(3->8) -> Relu -> conv(8->4 or depthwise 8), channel ranges 100x apart."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 1, (8, 3, 3, 3)) * np.logspace(-1, 1, 8)[:, None, None, None]
    w2 = rng.normal(0, 1, (8, 1, 3, 3) if depthwise else (4, 8, 1, 1))
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node(
            "Conv", ["r", "w2", "b2"], ["y"], name="conv2", group=8 if depthwise else 1
        ),
    ]
    inits = {"w1": w1, "b1": rng.normal(0, 0.1, 8), "w2": w2, "b2": rng.normal(0, 0.1, w2.shape[0])}
    return _model(nodes, inits, ["N", 3, 8, 8], None)


@pytest.mark.parametrize("depthwise", [False, True])
def test_cross_layer_equalization_preserves_fp32_and_equalizes_ranges(depthwise):
    model = _conv_pair(depthwise)
    x = {"x": np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)}
    equalized = recipes.cross_layer_equalization(model_io.copy_model(model))
    np.testing.assert_allclose(_run(equalized, x), _run(model, x), rtol=1e-4, atol=1e-4)

    def spread(m: onnx.ModelProto) -> float:
        w = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "w1"))
        r = np.abs(w.reshape(8, -1)).max(axis=1)
        return float(r.max() / r.min())

    assert spread(model) > 30 and spread(equalized) < spread(model) / 5


def _layernorm_mlp() -> onnx.ModelProto:
    """LayerNorm (one outlier channel in its scale) -> two MatMuls, like attention Q/K."""
    rng = np.random.default_rng(2)
    gamma = np.ones(16)
    gamma[3] = 40.0
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="ln", axis=-1),
        helper.make_node("MatMul", ["n", "wq"], ["q"], name="mm_q"),
        helper.make_node("MatMul", ["n", "wk"], ["k"], name="mm_k"),
        helper.make_node("Add", ["q", "k"], ["y"], name="sum"),
    ]
    inits = {
        "g": gamma,
        "b": rng.normal(0, 0.1, 16),
        "wq": rng.normal(0, 0.2, (16, 8)),
        "wk": rng.normal(0, 0.2, (16, 8)),
    }
    return _model(nodes, inits, ["N", 5, 16], None)


def test_smoothquant_preserves_fp32_and_flattens_activation_channels():
    model = _layernorm_mlp()
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(size=(4, 5, 16)).astype(np.float32)} for _ in range(3)]
    smoothed = recipes.smoothquant(model_io.copy_model(model), value=0.5, feeds=lambda: feeds)
    for feed in feeds:
        np.testing.assert_allclose(_run(smoothed, feed), _run(model, feed), rtol=1e-4, atol=1e-4)
    before = recipes.channel_statistics(model, {"n": -1}, feeds)["n"]["absmax"]
    after = recipes.channel_statistics(smoothed, {"n": -1}, feeds)["n"]["absmax"]
    assert before.max() / np.median(before) > 10
    assert after.max() / np.median(after) < before.max() / np.median(before) / 3


def test_smoothquant_rejects_bad_alpha_and_needs_data():
    with pytest.raises(lpq.ConfigError, match="alpha"):
        recipes.smoothquant(_layernorm_mlp(), value=1.5, feeds=lambda: [])
    with pytest.raises(lpq.ConfigError, match="calibration data"):
        recipes.smoothquant(_layernorm_mlp(), value=0.5, feeds=None)


def test_fake_quant_weight_matches_ort_symmetric_int8():
    from onnxruntime.quantization.quant_utils import quantize_data

    w = np.random.default_rng(4).normal(size=(6, 5)).astype(np.float32)
    zero, scale, q = quantize_data(w.reshape(-1), TensorProto.INT8, True)[-3:]
    ort_dq = ((q.astype(np.float32) - zero) * scale).reshape(w.shape)
    np.testing.assert_allclose(recipes.fake_quant_weight(w, None), ort_dq, rtol=1e-6, atol=1e-7)


def test_bias_correction_reduces_mean_output_error(pm):
    """Per-tensor int8 weights on a conv fed with offset inputs: the mean error per output
    channel shrinks with bias correction (numpy reference: |mean(y_int8 - y_fp32)|)."""
    rng = np.random.default_rng(5)
    w = rng.normal(0, 1, (16, 8, 3, 3)) * np.linspace(0.05, 1.0, 16)[:, None, None, None]
    model = _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        {"w": w, "b": np.zeros(16)},
        ["N", 8, 6, 6],
        None,
    )
    x = (rng.normal(size=(64, 8, 6, 6)) + 2.0).astype(np.float32)  # non-zero mean input
    loader = lpq.ArrayLoader(x, batch_size=16)
    cap = pm.query_capability(FW, model, loader, {})
    ops = {
        key: next(
            c
            for c in cap.op_configs(key)
            if c.weight is not None
            and c.weight.granularity == "per_tensor"
            and c.activation is not None
            and c.activation.dtype == "uint8"
        )
        for key in cap.opwise
    }
    fp32 = _run(model, {"x": x})

    def mean_error(options: dict[str, Any]) -> float:
        cfg = lpq.TuneConfig(ops=ops, calib_sampling_size=64, options=options)
        qmodel = pm.quantize(FW, model, cfg, loader)
        out = _run(qmodel.proto, {"x": x})
        return float(np.abs((out - fp32).mean(axis=(0, 2, 3))).mean())

    plain = mean_error({})
    corrected = mean_error({"bias_correction": True})
    assert corrected < 0.5 * plain, (plain, corrected)


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


def test_recipes_are_chosen_by_option_name():
    assert recipes.requested({"smoothquant": 0.5, "bias_correction": False}) == {"smoothquant": 0.5}
    assert set(recipes.RECIPES) == {
        "cross_layer_equalization",
        "smoothquant",
        "bias_correction",
        "adaround",
    }


def test_adaround_beats_nearest_rounding_on_held_out_inputs():
    """numpy reference: output error of rounding to nearest vs learned rounding, on inputs
    the optimisation never saw (correlated inputs, where nearest is far from optimal)."""
    from lpq_onnxrt.adaround import learn_rounding

    rng = np.random.default_rng(7)
    mix = rng.normal(size=(32, 32))
    x = (rng.normal(size=(3000, 32)) @ mix).astype(np.float32)[:, None, :]
    w = rng.normal(0, 0.1, (1, 16, 32)).astype(np.float32)
    scale = (np.abs(w).max(axis=2, keepdims=True) / 127).astype(np.float32)
    train, held = x[:2000], x[2000:]

    def error(wq: np.ndarray) -> float:
        return float(np.mean(np.einsum("ngk,gok->ngo", held, wq - w) ** 2))

    nearest = np.round(w / scale) * scale
    learned = learn_rounding(w, scale, train, iterations=400) * scale
    assert np.all(np.abs(learned / scale - np.round(learned / scale)) < 1e-4)  # on the grid
    assert np.all(np.abs(learned - w) <= scale * (1 + 1e-4))  # rounded up or down only
    assert error(learned) < 0.8 * error(nearest)


def test_adaround_weights_survive_ort_quantization(pm):
    """The written weights are on ORT's grid, ORT keeps them, and the error they add to
    the layer output on held-out inputs is below ORT's own (nearest) rounding."""
    rng = np.random.default_rng(8)
    mix = rng.normal(size=(24, 24)).astype(np.float32)
    w = rng.normal(0, 0.2, (24, 12)).astype(np.float32)
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], {"w": w}, ["N", 24], ["N", 12]
    )
    x = (rng.normal(size=(512, 24)).astype(np.float32) @ mix).astype(np.float32)
    calib, held = lpq.ArrayLoader(x[:256], batch_size=32), x[256:]
    cap = pm.query_capability(FW, model, calib, {})
    ops = {key: cap.default_op_config(key) for key in cap.opwise}
    fp32 = _run(model, {"x": held})

    def quantize(options: dict[str, Any]) -> Any:
        cfg = lpq.TuneConfig(ops=ops, calib_sampling_size=256, options=options)
        return pm.quantize(FW, model, cfg, calib)

    plain, rounded = quantize({}), quantize({"adaround": 300})
    inits = {i.name: numpy_helper.to_array(i) for i in rounded.proto.graph.initializer}
    q, s = inits["w_quantized"].astype(np.float32), inits["w_scale"]
    assert np.all(np.abs(q - np.round(w / s)) <= 1)  # each weight moved at most one step
    assert np.any(q != np.round(w / s))  # and some did move

    def weight_error(qmodel: Any) -> float:
        found = {i.name: numpy_helper.to_array(i) for i in qmodel.proto.graph.initializer}
        dequantized = found["w_quantized"].astype(np.float32) * found["w_scale"]
        return float(np.mean((held @ dequantized - fp32) ** 2))

    assert weight_error(rounded) < 0.9 * weight_error(plain)
    assert _run(rounded.proto, {"x": held}).shape == fp32.shape


def test_adaround_on_convs_and_gemm_of_the_digits_cnn(
    pm, lpq_sample_model, calib_loader, eval_loader
):
    """im2col sampling for padded convs, Gemm weights: the model stays as accurate."""
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    ops = {key: cap.default_op_config(key) for key in cap.opwise}
    cfg = lpq.TuneConfig(ops=ops, calib_sampling_size=100, options={"adaround": 100})
    qmodel = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    fp32 = pm.evaluate(FW, lpq_sample_model, eval_loader, [lpq.TopK(1)]).accuracy
    assert pm.evaluate(FW, qmodel, eval_loader, [lpq.TopK(1)]).accuracy >= fp32 - 0.01
