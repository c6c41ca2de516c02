"""Exact fp32 rewrites: affine folds into Conv and the spelled-out HardSwish."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from lpq_onnxrt import model_io
from lpq_onnxrt.simplify import simplify


def _paddle_style_block() -> onnx.ModelProto:
    """conv -> *c + d (per-channel) -> HardSwish spelled out -> *s + t (scalars) -> conv."""
    rng = np.random.default_rng(0)

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    inits = [
        const("w1", rng.normal(0, 0.3, (8, 3, 3, 3))),
        const("b1", rng.normal(0, 0.1, (8,))),
        const("c", rng.uniform(0.5, 1.5, (1, 8, 1, 1))),
        const("d", rng.normal(0, 0.2, (1, 8, 1, 1))),
        const("three", 3.0),
        const("zero", 0.0),
        const("six", 6.0),
        const("s", [1.3]),
        const("t", [-0.2]),
        const("w2", rng.normal(0, 0.3, (4, 8, 1, 1))),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["y"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "y"], ["y1"], name="scale"),
        helper.make_node("Add", ["y1", "d"], ["y2"], name="shift"),
        helper.make_node("Add", ["y2", "three"], ["a"], name="plus3"),
        helper.make_node("Clip", ["a", "zero", "six"], ["r"], name="relu6"),
        helper.make_node("Mul", ["y2", "r"], ["m"], name="gate"),
        helper.make_node("Div", ["m", "six"], ["h"], name="div6"),
        helper.make_node("Mul", ["s", "h"], ["h1"], name="lab_scale"),
        helper.make_node("Add", ["h1", "t"], ["h2"], name="lab_shift"),
        helper.make_node("Conv", ["h2", "w2"], ["out"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 16, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})[0]


def test_rewrites_preserve_fp32_outputs():
    model = _paddle_style_block()
    x = np.random.default_rng(1).normal(0, 1, (2, 3, 16, 16)).astype(np.float32)
    expected = _run(model, x)
    work = model_io.copy_model(model)
    made = simplify(work)
    ops = Counter(node.op_type for node in work.graph.node)
    assert made == 2  # one affine fold, one HardSwish
    assert ops == Counter({"Conv": 2, "HardSigmoid": 1, "Mul": 2, "Add": 1})
    onnx.checker.check_model(work)
    np.testing.assert_allclose(_run(work, x), expected, rtol=1e-5, atol=1e-5)


def test_prepare_applies_the_rewrites_and_keeps_surviving_names():
    prepared = model_io.prepare(_paddle_style_block())
    names = {node.name for node in prepared.model.graph.node}
    assert {"conv1", "conv2", "gate"} <= names
    assert not names & {"scale", "shift", "plus3", "relu6", "div6"}


def test_conv_output_read_twice_is_not_folded():
    model = _paddle_style_block()
    extra = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model.graph.output.append(extra)  # the conv output is now also a graph output
    work = model_io.copy_model(model)
    simplify(work)
    assert "scale" in {node.name for node in work.graph.node}
