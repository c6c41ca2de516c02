"""A tiny YOLOv8-style detector quantized end to end and scored with detection F1 against
its fp32 detections (issue 26, item 3 and its test list).

The model is built here: a conv stack over a (1, 3, 64, 64) image whose head is
``(1, 4+C, A)``: box centres on a 4-pixel grid plus a learned offset, sizes from a
sigmoid, class scores from a sigmoid, as Ultralytics exports. Only lpq's public API is
used (``lpq.quantize``, ``lpq.get_plugin_manager()``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpq
from lpq.eval.data import ArrayLoader, OutputRecorder, ReferenceLoader
from lpq.eval.metric_choice import label_free_metric
from lpq.eval.task_metrics import DetectionF1, DetectionMAP50

pytest.importorskip("onnxruntime")

CLASSES = 3
GRID = 16  # 64 / 4: A = 256 anchors


def tiny_yolo(path: Path) -> Path:
    rng = np.random.default_rng(0)

    def conv(name: str, cin: int, cout: int, k: int, stride: int, scale: float) -> list:
        w = (rng.normal(size=(cout, cin, k, k)) * scale / np.sqrt(cin * k * k)).astype(np.float32)
        b = rng.normal(0, 0.1, cout).astype(np.float32)
        inits.extend(
            [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
        )
        return [f"{name}_w", f"{name}_b"]

    inits: list = []
    grid = (
        np.stack(np.meshgrid(np.arange(GRID), np.arange(GRID)), 0) * 4.0 + 2.0
    )  # (2, 16, 16) x, y
    consts = {
        "grid": grid.reshape(1, 2, GRID * GRID).astype(np.float32),
        "four": np.array(4.0, np.float32),
        "size": np.array(24.0, np.float32),
        "bias": np.array(8.0, np.float32),  # most anchors score low, as a detector's do
        "shape": np.array([1, 4 + CLASSES, GRID * GRID], np.int64),
        "split": np.array([2, 2, CLASSES], np.int64),
    }
    inits.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    nodes = [
        helper.make_node(
            "Conv",
            ["image", *conv("c1", 3, 16, 3, 2, 2.0)],
            ["h1"],
            pads=[1] * 4,
            strides=[2, 2],
            name="c1",
        ),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node(
            "Conv",
            ["r1", *conv("c2", 16, 32, 3, 2, 2.0)],
            ["h2"],
            pads=[1] * 4,
            strides=[2, 2],
            name="c2",
        ),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node(
            "Conv", ["r2", *conv("c3", 32, 32, 3, 1, 2.0)], ["h3"], pads=[1] * 4, name="c3"
        ),
        helper.make_node("Relu", ["h3"], ["r3"], name="relu3"),
        helper.make_node(
            "Conv", ["r3", *conv("head", 32, 4 + CLASSES, 1, 1, 6.0)], ["raw"], name="head"
        ),
        helper.make_node("Reshape", ["raw", "shape"], ["flat"], name="flatten"),
        helper.make_node("Split", ["flat", "split"], ["xy", "wh", "cls"], axis=1, name="split"),
        helper.make_node("Tanh", ["xy"], ["xy_t"], name="xy_tanh"),
        helper.make_node("Mul", ["xy_t", "four"], ["xy_off"], name="xy_scale"),
        helper.make_node("Add", ["xy_off", "grid"], ["centre"], name="xy_grid"),
        helper.make_node("Sigmoid", ["wh"], ["wh_s"], name="wh_sigmoid"),
        helper.make_node("Mul", ["wh_s", "size"], ["box_wh"], name="wh_scale"),
        helper.make_node("Sub", ["cls", "bias"], ["cls_b"], name="cls_bias"),
        helper.make_node("Sigmoid", ["cls_b"], ["scores"], name="cls_sigmoid"),
        helper.make_node(
            "Concat", ["centre", "box_wh", "scores"], ["output"], axis=1, name="concat"
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_yolo",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4 + CLASSES, GRID * GRID])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # onnx 1.23 stamps a newer one than ORT 1.31 reads
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def images(count: int, seed: int) -> np.ndarray:
    """Dark images with a few bright rectangles: structure for the convs to respond to."""
    rng = np.random.default_rng(seed)
    out = rng.uniform(0, 0.2, (count, 3, 64, 64)).astype(np.float32)
    for img in out:
        for _ in range(4):
            x, y = rng.integers(0, 52, 2)
            w, h = rng.integers(6, 14, 2)
            img[:, y : y + h, x : x + w] += rng.uniform(0.5, 1.0, (3, 1, 1)).astype(np.float32)
    return out


def test_tiny_yolo_quantized_end_to_end_scored_by_detection_f1(tmp_path: Path):
    path = tiny_yolo(tmp_path / "tiny_yolo.onnx")
    calib, held_out = images(16, seed=1), images(24, seed=2)
    quantized = lpq.quantize(
        str(path),
        lpq.PostTrainingQuantConfig(approach="static", latency_aware=False),
        ArrayLoader(calib, batch_size=1),
    )
    pm = lpq.get_plugin_manager()
    data = ArrayLoader(held_out, batch_size=1)  # the model's batch is fixed at 1

    # The label-free contract: record the fp32 outputs, pair them with the inputs as labels.
    recorder = OutputRecorder()
    pm.evaluate(quantized.framework, str(path), data, [recorder])
    assert label_free_metric(recorder.outputs[0])[0] == "detection_f1"
    reference = ReferenceLoader(data, recorder.outputs)

    same = DetectionF1()
    for out in recorder.outputs:
        same.update(out, out)
    assert same.result() == 1.0  # fp32 against itself

    f1, map50 = DetectionF1(), DetectionMAP50()
    result = pm.evaluate(quantized.framework, quantized.model, reference, [f1, map50])
    assert f1.images == len(held_out)
    assert f1.reference_detections >= 40, "scored on real fp32 detections"
    assert f1.reference_detections == same.reference_detections
    assert 0.0 <= result.metrics["detection_f1"] <= 1.0
    assert 0.0 <= result.metrics["detection_map50"] <= 1.0
    # How much int8 keeps depends on the CPU's kernels: only the range is asserted here.
    assert result.metrics["detection_f1"] == f1.result()

    # Not a tautology: the quantized model's raw head differs from fp32's, and a model
    # whose boxes all move scores 0.
    got = OutputRecorder()
    pm.evaluate(quantized.framework, quantized.model, data, [got])
    assert any(not np.array_equal(g, r) for g, r in zip(got.outputs, recorder.outputs))
    moved = DetectionF1()
    for out, ref in zip(recorder.outputs, recorder.outputs):
        shifted = np.array(out[0] if isinstance(out, list) else out, copy=True)
        shifted[:, 0] += 1000.0  # every box moves off the image, away from every fp32 box
        moved.update(shifted, ref)
    assert moved.result() == 0.0 and moved.reference_detections >= 40


def test_diagnose_scores_every_fallback_with_the_detection_metric(tmp_path: Path, capsys):
    """`lpq diagnose` uses the gate's task metric: detection F1 against the fp32
    detections, for the quantized model and for each op fallen back (not only the
    relative error of the raw head); a named metric with an option is used as named."""
    from lpq.cli import main
    from lpq.diagnose import diagnose

    path = tiny_yolo(tmp_path / "tiny_yolo.onnx")
    calib, held_out = images(16, seed=1), images(24, seed=2)
    data = ArrayLoader(held_out, batch_size=1)
    config = lpq.PostTrainingQuantConfig(approach="static", latency_aware=False)
    result = diagnose(str(path), data, calib=ArrayLoader(calib, batch_size=1), config=config,
                      worst=2)  # fmt: skip
    assert result.metric == "detection_f1" and "YOLOv8-style head" in result.metric_reason
    assert result.fidelity is not None and 0.0 <= result.fidelity <= 1.0
    fallen = [op for op in result.ops if op.fallback is not None]
    assert len(fallen) == 2
    assert all(op.fallback is not None and op.fallback.fidelity is not None for op in fallen)

    # The same number the gate's metric gives through the adaptor's evaluate.
    pm = lpq.get_plugin_manager()
    recorder = OutputRecorder()
    pm.evaluate("onnxrt", str(path), data, [recorder])
    quantized = lpq.quantize(str(path), config, ArrayLoader(calib, batch_size=1))
    f1 = DetectionF1()
    pm.evaluate("onnxrt", quantized.model, ReferenceLoader(data, recorder.outputs), [f1])
    assert result.fidelity == pytest.approx(f1.result())

    strict = diagnose(str(path), data, calib=ArrayLoader(calib, batch_size=1), config=config,
                      worst=0, metric="detection_f1",
                      metric_options={"score_threshold": 0.9})  # fmt: skip
    assert strict.metric_reason == "named (score_threshold=0.9)"
    f1_strict = DetectionF1(score_threshold=0.9)
    pm.evaluate("onnxrt", quantized.model, ReferenceLoader(data, recorder.outputs), [f1_strict])
    assert f1_strict.reference_detections < f1.reference_detections  # the option took effect
    assert strict.fidelity == pytest.approx(f1_strict.result())

    # A wrong option is a clear error before any work (nothing quantized, no report).
    npz = tmp_path / "images.npz"
    np.savez(npz, image=held_out)
    out = tmp_path / "report"
    code = main(["diagnose", str(path), "--data", str(npz), "--batch-size", "1", "--metric",
                 "detection_f1", "--metric-option", "treshold=0.5", "--out", str(out)])  # fmt: skip
    said = capsys.readouterr()
    assert code == 2 and "treshold" in said.err + said.out and not out.exists()
