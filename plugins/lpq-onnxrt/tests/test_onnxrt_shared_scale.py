"""The shared-scale rule on real ONNX Runtime quantization: a YOLOv8-style head's final
Concat of pixel boxes and class probabilities stays fp32, and its scores survive; turned
off, the one int8 scale rounds the scores away (what NudeNet's detector showed, issue 26).
The rule itself is core's, tested in tests/test_ranges_shared_scale.py."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpq
from lpq.eval.data import ArrayLoader

FW = "onnxrt"
ANCHORS = 64


def yolo_head(box_scale: float) -> onnx.ModelProto:
    """image -> 1x1 Conv -> (1, 5, 64) -> boxes (sigmoid x ``box_scale``) and one class
    score (sigmoid), concatenated as Ultralytics exports a head."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 1.5, (5, 3, 1, 1)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 0.5, 5).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([1, 5, ANCHORS], np.int64), "shape"),
        numpy_helper.from_array(np.array([4, 1], np.int64), "parts"),
        numpy_helper.from_array(np.array(box_scale, np.float32), "pixels"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w", "b"], ["raw"], name="head"),
        helper.make_node("Reshape", ["raw", "shape"], ["flat"], name="flatten"),
        helper.make_node("Split", ["flat", "parts"], ["box", "cls"], axis=1, name="split"),
        helper.make_node("Sigmoid", ["box"], ["box_s"], name="box_sigmoid"),
        helper.make_node("Mul", ["box_s", "pixels"], ["boxes"], name="box_scale"),
        helper.make_node("Sigmoid", ["cls"], ["scores"], name="cls_sigmoid"),
        helper.make_node("Concat", ["boxes", "scores"], ["output"], axis=1, name="concat"),
    ]
    graph = helper.make_graph(
        nodes,
        "yolo_head",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 5, ANCHORS])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (count, 3, 8, 8)).astype(np.float32)


def quantize(model: onnx.ModelProto, **options: Any) -> Any:
    pm = lpq.get_plugin_manager()
    loader = ArrayLoader(images(16, seed=1), batch_size=1)
    cap = pm.query_capability(FW, model, loader, {})
    cfg = lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=16,
        options={"quant_format": "qdq", "latency_aware": False, **options},
    )
    return pm.quantize(FW, model, cfg, loader)


def score_error(fp32: onnx.ModelProto, quantized: onnx.ModelProto) -> float:
    """Largest class-score difference over held-out images."""
    sessions = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for m in (fp32, quantized)
    ]
    worst = 0.0
    for image in images(8, seed=2):
        ref, got = (s.run(None, {"image": image[None]})[0] for s in sessions)
        worst = max(worst, float(np.abs(ref[:, 4] - got[:, 4]).max()))
    return worst


def concat_quantized(result: Any) -> bool:
    return bool(result.tune_cfg.ops[("concat", "Concat")].quantized)


def test_a_head_concat_of_pixels_and_probabilities_stays_fp32(caplog):
    model = yolo_head(320.0)
    with caplog.at_level(logging.INFO, logger="lpq_onnxrt"):
        result = quantize(model)
    assert not concat_quantized(result)
    assert any("kept fp32: concat" in r.getMessage() for r in caplog.records)
    # Read from the built graph: the output comes from the float Concat, no Q/DQ after it.
    (writer,) = [n for n in result.proto.graph.node if "output" in n.output]
    assert writer.op_type == "Concat"
    # The rest is still int8: the conv reads a quantized input.
    assert any(n.op_type == "QuantizeLinear" for n in result.proto.graph.node)
    # What is left is the conv's and the sigmoid's own rounding.
    assert score_error(model, result.proto) < 0.08


def test_turned_off_the_one_scale_rounds_the_scores_away():
    model = yolo_head(320.0)
    result = quantize(model, concat_max_spread=0)
    assert concat_quantized(result)
    # One step of a [0, 320] int8 range is 1.25: scores in [0, 1] read 0 or 1.25.
    assert score_error(model, result.proto) > 0.3


def test_a_concat_of_alike_ranges_is_quantized():
    model = yolo_head(2.0)  # boxes in [0, 2] beside scores in [0, 1]
    result = quantize(model)
    assert concat_quantized(result)
    assert score_error(model, result.proto) < 0.08


def test_a_bad_limit_is_a_clear_error():
    with pytest.raises(lpq.ConfigError, match="concat_max_spread"):
        quantize(yolo_head(320.0), concat_max_spread="wide")


def test_a_16_bit_concat_is_left_quantized():
    """The limit is for 8-bit scales: 16-bit activations keep 4096 levels for the scores."""
    model = yolo_head(320.0)
    pm = lpq.get_plugin_manager()
    loader = ArrayLoader(images(16, seed=1), batch_size=1)
    cap = pm.query_capability(FW, model, loader, {})
    ops = {}
    for key in cap.opwise:
        cfg = cap.default_op_config(key)
        if cfg.activation is not None:
            sixteen = lpq.TensorConfig(**{**vars(cfg.activation), "dtype": "uint16"})
            cfg = lpq.OpConfig(cfg.precision, cfg.mode, cfg.weight, sixteen)
        ops[key] = cfg
    cfg = lpq.TuneConfig(ops=ops, calib_sampling_size=16, options={"latency_aware": False})
    result = pm.quantize(FW, model, cfg, loader)
    assert concat_quantized(result)
    assert score_error(model, result.proto) < 0.03
