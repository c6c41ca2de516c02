"""The static pass's two shortcuts through ORT's quantizer build the model ORT's own path
builds: shape inference in memory (ORT skips its round trip through temporary files: a
deep copy, a save, file-to-file inference and a load per build), and a faster
``replace_input_of_all_nodes`` on the quantizer's model. The dynamic pass infers shapes in
memory too, also where ORT's dynamic quantizer infers them again after rewriting Gemms."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import numpy_helper

import lpq

FW = "onnxrt"


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


def _cfg(pm: lpq.PluginManager, model: Any, loader: Any) -> lpq.TuneConfig:
    cap = pm.query_capability(FW, model, loader, {})
    return lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=100,
        options={"quant_format": "qdq", "latency_aware": False},
    )


def test_no_file_round_trip_and_the_same_model(pm, lpq_sample_model, calib_loader, monkeypatch):
    from onnxruntime.quantization import base_quantizer

    from lpq_onnxrt.passes import static

    trips: list[int] = []
    original = base_quantizer.save_and_reload_model_with_shape_infer

    def counted(model: Any) -> Any:
        trips.append(1)
        return original(model)

    monkeypatch.setattr(base_quantizer, "save_and_reload_model_with_shape_infer", counted)
    rewired: list[str] = []
    original_rewiring = static.fast_rewiring

    def counted_rewiring(quantizer: Any) -> None:
        original_rewiring(quantizer)
        fast_replace = quantizer.model.replace_input_of_all_nodes

        def replace(old: str, new: str) -> None:
            rewired.append(old)
            fast_replace(old, new)

        quantizer.model.replace_input_of_all_nodes = replace

    monkeypatch.setattr(static, "fast_rewiring", counted_rewiring)
    cfg = _cfg(pm, lpq_sample_model, calib_loader)
    fast = pm.quantize(FW, lpq_sample_model, cfg, calib_loader).proto
    assert trips == [] and rewired  # both shortcuts taken
    monkeypatch.setattr(static, "with_inferred_shapes", lambda model: model)
    monkeypatch.setattr(static, "fast_rewiring", lambda quantizer: None)
    ort_path = pm.quantize(FW, lpq_sample_model, cfg, calib_loader).proto
    assert trips  # ORT's own path ran: the comparison below means something
    assert list(fast.graph.node) == list(ort_path.graph.node)
    ours = {t.name: numpy_helper.to_array(t) for t in fast.graph.initializer}
    theirs = {t.name: numpy_helper.to_array(t) for t in ort_path.graph.initializer}
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert value.dtype == theirs[name].dtype and np.array_equal(value, theirs[name]), name


def test_fast_rewiring_renames_every_use_as_ort_does():
    from onnx import TensorProto, helper
    from onnxruntime.quantization.onnx_model import ONNXModel

    from lpq_onnxrt.passes.quantizer import fast_rewiring

    def model() -> Any:
        nodes = [
            helper.make_node("Add", ["a", "a"], ["b"], name="add"),  # twice in one node
            helper.make_node("Mul", ["b", "c"], ["d"], name="mul"),
            helper.make_node("Relu", ["c"], ["e"], name="relu"),
        ]
        value = helper.make_tensor_value_info
        graph = helper.make_graph(
            nodes,
            "g",
            [value(n, TensorProto.FLOAT, [2]) for n in "ac"],
            [value(n, TensorProto.FLOAT, [2]) for n in "de"],
        )
        return helper.make_model(graph)

    class Quantizer:
        def __init__(self) -> None:
            self.model = ONNXModel(model())

    ours, theirs = Quantizer(), Quantizer()
    fast_rewiring(ours)
    for old, new in [("a", "a_dq"), ("c", "c_dq"), ("missing", "x")]:
        ours.model.replace_input_of_all_nodes(old, new)
        theirs.model.replace_input_of_all_nodes(old, new)
    assert [list(n.input) for n in ours.model.model.graph.node] == [
        ["a_dq", "a_dq"],
        ["b", "c_dq"],
        ["c_dq"],
    ]
    assert ours.model.model == theirs.model.model


def test_fast_rewiring_keeps_no_build_alive():
    """The replacement is an attribute of the model it rewires: it must not hold that
    model strongly (a cycle kept every candidate build alive until the cyclic collector
    ran: +230 MB peak on a 54 MB model)."""
    import gc
    import weakref

    from onnx import TensorProto, helper
    from onnxruntime.quantization.onnx_model import ONNXModel

    from lpq_onnxrt.passes.quantizer import fast_rewiring

    node = helper.make_node("Relu", ["a"], ["b"], name="relu")
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "g", [value("a", TensorProto.FLOAT, [2])], [value("b", TensorProto.FLOAT, [2])]
    )

    class Quantizer:
        def __init__(self) -> None:
            self.model = ONNXModel(helper.make_model(graph))

    quantizer = Quantizer()
    fast_rewiring(quantizer)
    quantizer.model.replace_input_of_all_nodes("a", "a_dq")
    alive = weakref.ref(quantizer.model)
    gc.disable()
    try:
        del quantizer
        assert alive() is None  # freed by reference counting alone
    finally:
        gc.enable()


def test_shape_inference_sees_weights_as_typed_inputs_and_keeps_shape_constants():
    from onnx import TensorProto, helper

    from lpq_onnxrt.passes.quantizer import with_inferred_shapes
    from lpq_onnxrt.weights import for_shape_inference

    weight = numpy_helper.from_array(np.ones((8, 4, 3, 3), np.float32), "w")  # 1152 bytes
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    scale = numpy_helper.from_array(np.array([2.0], np.float32), "small")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Mul", ["c", "small"], ["m"], name="mul"),
        helper.make_node("Reshape", ["m", "shape"], ["y"], name="reshape"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [value("y", TensorProto.FLOAT, None)],
        [weight, shape, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    light = for_shape_inference(model)
    assert [i.name for i in light.graph.initializer] == ["shape", "small"]
    typed = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in light.graph.input}
    assert typed == {"x": [1, 4, 6, 6], "w": [8, 4, 3, 3]}
    inferred = with_inferred_shapes(model)
    assert inferred is model and len(model.graph.initializer) == 3  # in place, weights kept
    shapes = {
        vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in (*model.graph.value_info, *model.graph.output)
    }
    assert shapes["c"] == [1, 8, 4, 4] and shapes["y"] == [1, 128]


def _gemm_then_matmul() -> Any:
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "G", "g"], ["h"], name="gemm", transB=1),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "M"], ["y"], name="matmul"),
        ],
        "gemm_then_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
        [
            numpy_helper.from_array(rng.normal(0, 0.2, (64, 32)).astype(np.float32), "G"),
            numpy_helper.from_array(rng.normal(0, 0.2, (64,)).astype(np.float32), "g"),
            numpy_helper.from_array(rng.normal(0, 0.2, (64, 16)).astype(np.float32), "M"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_the_dynamic_pass_infers_shapes_in_memory_with_the_same_model(monkeypatch, granularity):
    """ORT's dynamic quantizer re-infers shapes after turning Gemms into MatMuls, through a
    copy saved to files and loaded back; lpq runs that inference in memory on the model
    itself. The graph and every value are those of ORT's own path."""
    import contextlib

    from onnxruntime.quantization import onnx_quantizer

    from lpq_onnxrt.passes import dynamic

    ops = {
        name: lpq.OpConfig(
            "int8",
            "dynamic",
            weight=lpq.TensorConfig("int8", "sym", granularity),
            activation=lpq.TensorConfig("uint8", "asym"),
        )
        for name in ("gemm", "matmul")
    }
    trips: list[int] = []
    monkeypatch.setattr(onnx_quantizer.onnx, "save_model", lambda *a, **k: trips.append(1))
    fast = dynamic.dynamic_pass(_gemm_then_matmul(), ops, {})
    assert trips == []  # nothing written to files
    monkeypatch.undo()
    monkeypatch.setattr(dynamic, "shapes_inferred_in_memory", contextlib.nullcontext)
    monkeypatch.setattr(dynamic, "with_inferred_shapes", lambda model: model)
    ort_path = dynamic.dynamic_pass(_gemm_then_matmul(), ops, {})
    assert any(node.op_type == "MatMulInteger" for node in fast.graph.node)
    assert [(n.op_type, list(n.input), list(n.output)) for n in fast.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in ort_path.graph.node
    ]
    ours = {t.name: numpy_helper.to_array(t) for t in fast.graph.initializer}
    theirs = {t.name: numpy_helper.to_array(t) for t in ort_path.graph.initializer}
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert value.dtype == theirs[name].dtype and np.array_equal(value, theirs[name]), name
