"""Model preparation, detection, data validation and bad-input errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpq
from lpq import TopK
from lpq_onnxrt import model_io

FW = "onnxrt"


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


def _unnamed_model(ir_version: int | None = 8, opset: int | None = 17) -> onnx.ModelProto:
    """Conv -> Relu -> Conv with no node names (as some exporters write them)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.3, (4, 2, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.3, (3, 4, 1, 1)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["b"]),
            helper.make_node("Conv", ["b", "w2"], ["y"]),
        ],
        "unnamed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [w1, w2],
    )
    if opset is None:
        model = helper.make_model(graph)  # onnx's defaults: IR 14 / opset 28 on onnx 1.23
    else:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def _loader(n: int = 16) -> lpq.ArrayLoader:
    x = np.random.default_rng(1).normal(0, 1, (n, 2, 6, 6)).astype(np.float32)
    return lpq.ArrayLoader(x, batch_size=8)


def test_unnamed_nodes_get_stable_unique_names(pm):
    cap1 = pm.query_capability(FW, _unnamed_model(), None, {})
    cap2 = pm.query_capability(FW, _unnamed_model(), None, {})
    names = [name for name, _ in cap1.opwise]
    assert names == [name for name, _ in cap2.opwise] == ["Conv_0", "Conv_2"]
    qmodel = pm.quantize(
        FW,
        _unnamed_model(),
        lpq.TuneConfig(ops={k: cap1.default_op_config(k) for k in cap1.opwise}),
        _loader(),
    )
    assert {"Conv_0", "Conv_2"} <= {n.name for n in qmodel.proto.graph.node}


def test_duplicate_names_are_made_unique():
    model = _unnamed_model()
    for node in model.graph.node:
        node.name = "same"
    assert model_io.name_nodes(model) == 2
    assert len({n.name for n in model.graph.node}) == 3


def test_onnx_default_ir_and_opset_are_normalised(pm):
    model = _unnamed_model(ir_version=None, opset=None)
    assert model.ir_version > model_io.MAX_IR_VERSION  # what onnx 1.23 stamps
    loader = lpq.ArrayLoader(np.ones((4, 2, 6, 6), np.float32), np.zeros(4, np.int64))
    result = pm.evaluate(FW, model, loader, [TopK(1)])
    assert result.samples == 4
    cap = pm.query_capability(FW, model, None, {})
    qmodel = pm.quantize(
        FW,
        model,
        lpq.TuneConfig(ops={k: cap.default_op_config(k) for k in cap.opwise}),
        _loader(),
    )
    assert qmodel.proto.ir_version <= model_io.MAX_IR_VERSION


def _reading_input_shapes() -> onnx.ModelProto:
    """:func:`_unnamed_model` with a Shape node of its input (an output of the graph): the
    shape read is known or the input's own ``N``, which no inference makes constant."""
    model = _unnamed_model()
    model.graph.node.append(helper.make_node("Shape", ["x"], ["x_shape"]))
    model.graph.output.append(helper.make_tensor_value_info("x_shape", TensorProto.INT64, [4]))
    return model


def _reading_shapes() -> onnx.ModelProto:
    """:func:`_reading_input_shapes`, and ``y`` flattened to ``(N, -1)`` by a Reshape whose
    target is computed from that shape, whose own shape is read again: onnx's inference
    leaves the flattened dim open, ORT's symbolic inference finds it (108), a graph it
    runs on."""
    model = _reading_input_shapes()
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([-1], np.int64), "rest"),
        ]
    )
    model.graph.node.extend(
        [
            helper.make_node("Slice", ["x_shape", "zero", "one"], ["n"]),
            helper.make_node("Concat", ["n", "rest"], ["target"], axis=0),
            helper.make_node("Reshape", ["y", "target"], ["flat"]),
            helper.make_node("Shape", ["flat"], ["flat_shape"]),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("flat_shape", TensorProto.INT64, [2]))
    return model


@pytest.fixture
def symbolic_calls(monkeypatch) -> list[str]:
    """A list that gets "symbolic" each time ORT's symbolic shape inference runs."""
    calls: list[str] = []
    symbolic = model_io._symbolic_shapes

    def counted(model):
        calls.append("symbolic")
        return symbolic(model)

    monkeypatch.setattr(model_io, "_symbolic_shapes", counted)
    return calls


def test_symbolic_inference_is_skipped_where_no_inference_can_fold_the_shapes_read(
    symbolic_calls,
):
    """A graph that reads only shapes onnx's inference knows, or dims named after the
    inputs' own (NudeNet's YOLOv8 stores ``floor(height/32) + 1``-like ones), is left to
    onnx's inference: ORT's symbolic one cost NudeNet 2.3 CPU s for the same prepared
    graph. One whose Reshape target is computed needs it."""
    calls = symbolic_calls
    # an arange over N (YOLOv8's anchor grids): no inference of onnx's knows its length,
    # the exporter's value_info names it after N
    ranged = _reading_input_shapes()
    ranged.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(0, np.int64), "first"),
            numpy_helper.from_array(np.array(1, np.int64), "step"),
        ]
    )
    ranged.graph.node.extend(
        [
            helper.make_node("Gather", ["x_shape", "first"], ["n"], axis=0),
            helper.make_node("Range", ["first", "n", "step"], ["grid"]),
            helper.make_node("Shape", ["grid"], ["grid_shape"]),
        ]
    )
    ranged.graph.output.append(helper.make_tensor_value_info("grid_shape", TensorProto.INT64, [1]))
    assert model_io._needs_symbolic(ranged)  # open: symbolic inference decides, as before
    named = model_io.copy_model(ranged)
    named.graph.value_info.append(
        helper.make_tensor_value_info("grid", TensorProto.INT64, ["floor(N/1)"])
    )
    for model in (_reading_input_shapes(), named):
        assert not model_io._needs_symbolic(model)
        model_io.infer_shapes(model)
    assert calls == []
    assert model_io._needs_symbolic(_reading_shapes())
    inferred = model_io.infer_shapes(_reading_shapes())
    assert calls == ["symbolic"]
    flat = next(vi for vi in inferred.graph.value_info if vi.name == "flat")
    assert flat.type.tensor_type.shape.dim[1].dim_value == 108  # what symbolic inference adds


def test_symbolic_inference_runs_where_shapes_are_read_or_ops_are_not_standard(monkeypatch):
    """ORT's symbolic inference (slow: 5 s a call on PP-OCRv4 det) only for graphs that
    read shapes as data or hold contrib ops; onnx's own for the others, which keep their
    output dims as the model names them."""
    inference = model_io._symbolic_shape_inference()
    calls: list[int] = []
    run = inference._infer_impl

    def counted(self, *args):
        calls.append(1)
        return run(self, *args)

    monkeypatch.setattr(inference, "_infer_impl", counted)
    plain = model_io.infer_shapes(_unnamed_model())
    assert calls == [] and "a" in {vi.name for vi in plain.graph.value_info}
    assert plain.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "N"
    model_io.infer_shapes(_reading_shapes())
    assert calls
    calls.clear()
    contrib = _unnamed_model()
    contrib.graph.node[1].CopyFrom(
        helper.make_node("Gelu", ["a"], ["b"], domain="com.microsoft")  # ORT's contrib op
    )
    contrib.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    model_io.infer_shapes(contrib)
    assert calls


def test_preparation_runs_symbolic_inference_once_for_a_standard_graph(symbolic_calls):
    """The second pass of a preparation (after ORT's optimizer has folded what it could)
    only types the tensors: onnx's inference, unless ops outside the standard need ORT's
    (NudeNet's YOLOv8: 1.9 CPU s of symbolic inference for the same quantized model)."""
    calls = symbolic_calls
    model = _reading_shapes()
    prepared = model_io._prepare(model, "key")
    assert calls == ["symbolic"]  # the first pass only
    assert any(n.op_type == "Shape" for n in prepared.model.graph.node)  # N stays symbolic
    assert "a" in {vi.name for vi in prepared.model.graph.value_info}
    calls.clear()
    assert model_io._prepare(_unnamed_model(), "key2") and calls == []
    contrib = model_io.copy_model(model)
    contrib.graph.node[1].CopyFrom(helper.make_node("Gelu", ["a"], ["b"], domain="com.microsoft"))
    contrib.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    model_io._prepare(contrib, "key3")
    assert calls == ["symbolic", "symbolic"]  # ORT's contrib op: both passes


def test_shape_inference_falls_back_when_symbolic_fails(monkeypatch):
    inference = model_io._symbolic_shape_inference()

    def broken(*args, **kwargs):
        raise RuntimeError("symbolic inference failed")

    monkeypatch.setattr(inference, "_infer_impl", broken)
    inferred = model_io.infer_shapes(_reading_shapes())
    assert "a" in {vi.name for vi in inferred.graph.value_info}


def test_incomplete_symbolic_inference_leaves_no_file_in_the_cwd(monkeypatch, tmp_path):
    """ORT's infer_shapes writes sym_shape_infer_temp.onnx into the cwd when it gives up."""
    inference = model_io._symbolic_shape_inference()

    def gives_up(self, *args):
        self.run_ = False
        return False  # "not every shape inferred"

    monkeypatch.setattr(inference, "_infer_impl", gives_up)
    monkeypatch.chdir(tmp_path)
    inferred = model_io.infer_shapes(_reading_shapes())
    assert "a" in {vi.name for vi in inferred.graph.value_info}  # onnx's inference took over
    assert list(tmp_path.iterdir()) == []


def test_preparing_a_model_does_not_import_torch(tmp_path):
    """``onnxruntime.tools``' ``__init__`` imports torch when it is installed (250 MB of
    resident memory); shape inference loads ORT's symbolic inference without it."""
    pytest.importorskip("torch")
    path = tmp_path / "m.onnx"
    onnx.save(_unnamed_model(), str(path))
    code = (
        "import sys; from lpq_onnxrt import model_io; "
        f"prepared = model_io.prepare({str(path)!r}); "
        "assert prepared.model.graph.value_info, 'no shapes inferred'; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prepare_is_cached_per_content(monkeypatch):
    calls = []
    original = model_io.optimize
    monkeypatch.setattr(model_io, "optimize", lambda m, *a: calls.append(1) or original(m, *a))
    model = _unnamed_model()
    model.producer_name = "cache-test"  # a content no other test prepared
    first = model_io.prepare(model)
    second = model_io.prepare(model)
    assert first is second and len(calls) == 1


def test_detects_protos_and_onnx_files(pm, tmp_path, lpq_sample_model):
    assert pm.detect_framework(_unnamed_model()) == FW
    assert pm.detect_framework(str(lpq_sample_model)) == FW
    fake = tmp_path / "fake.onnx"
    fake.write_text("hello")  # 'h' is not a protobuf field tag
    with pytest.raises(lpq.NoAdaptorError):
        pm.detect_framework(fake)


def test_importing_the_plugin_does_not_import_onnxruntime():
    code = (
        "import sys, lpq; pm = lpq.get_plugin_manager(); pm.load(); "
        "assert 'onnxrt' in pm.adaptors and 'digits' in pm.examples; "
        "assert 'onnxruntime' not in sys.modules and 'onnx' not in sys.modules, "
        "sorted(m for m in sys.modules if 'onnx' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("content", [b"", b"\x08\x07garbage-not-a-model", b"not onnx at all"])
def test_corrupt_files_are_model_errors(pm, tmp_path, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    with pytest.raises(lpq.ModelError):
        pm.query_capability(FW, bad, None, {})


def test_missing_file_is_a_model_error(pm, tmp_path):
    with pytest.raises(lpq.ModelError, match="does not exist"):
        pm.query_capability(FW, tmp_path / "nope.onnx", None, {})


def test_model_ort_cannot_load_is_a_model_error(pm):
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], name="n", domain="example.custom")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    )
    model.ir_version = 8
    with pytest.raises(lpq.ModelError, match="ONNX Runtime cannot load"):
        pm.query_capability(FW, model, None, {})


def test_foreign_object_is_a_model_error(pm):
    with pytest.raises(lpq.ModelError, match="cannot read"):
        pm.query_capability(FW, {"not": "a model"}, None, {})


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ({"wrong_name": np.zeros((2, 1, 8, 8), np.float32)}, "unknown input.*wrong_name"),
        (np.zeros((2, 8, 8), np.float32), "shape .*expects float32\\[Nx1x8x8\\]"),
        (np.zeros((2, 1, 8, 8), np.int64), "dtype int64"),
        ((np.zeros((2, 1, 8, 8), np.float32), np.zeros((2, 1, 8, 8), np.float32)), "2 input array"),
    ],
)
def test_misfit_data_names_the_input(pm, lpq_sample_model, inputs, match):
    with pytest.raises(lpq.DataError, match=match) as info:
        pm.evaluate(FW, lpq_sample_model, [(inputs, np.zeros(2, np.int64))], [TopK(1)])
    assert "input" in str(info.value)


def test_feeds_accept_dicts_lists_and_float64(pm, lpq_sample_model, digits):
    x, y = digits["eval_x"][:20], digits["eval_y"][:20]
    results = [
        pm.evaluate(FW, lpq_sample_model, [(batch, y)], [TopK(1)]).accuracy
        for batch in ({"input": x}, [x], x.astype(np.float64))
    ]
    assert results[0] == results[1] == results[2] > 0.8


def test_empty_calibration_data_is_a_data_error(pm, lpq_sample_model):
    cap = pm.query_capability(FW, lpq_sample_model, None, {})
    cfg = lpq.TuneConfig(ops={k: cap.default_op_config(k) for k in cap.opwise})
    with pytest.raises(lpq.DataError, match="no batches"):
        pm.quantize(FW, lpq_sample_model, cfg, [])


def test_fused_patterns_found_in_the_model(pm, lpq_sample_model):
    patterns = pm.query_fused_patterns(FW, lpq_sample_model)
    assert ("Conv", "Relu") in patterns
    assert ("Gemm", "Relu") in patterns


def test_capability_reports_modes_per_node(pm, mlp_model, lpq_sample_model):
    cap = pm.query_capability(FW, mlp_model, None, {})
    modes = {c.mode for c in cap.opwise[("mm1", "MatMul")]}
    assert modes == {"static", "dynamic", "weight_only"}
    default = cap.default_op_config(("mm1", "MatMul"))
    assert (default.mode, default.activation.dtype, default.weight.dtype) == (
        "static",
        "uint8",
        "int8",
    )
    assert default.weight.granularity == "per_channel"
    digits_cap = pm.query_capability(FW, lpq_sample_model, None, {})
    # Reshape/Relu/MaxPool follow their neighbours and the bias Add (a constant operand)
    # stays with fp32: none is tuned separately. MatMul+Add is not fused into a Gemm.
    assert list(digits_cap.opwise) == [
        ("conv1", "Conv"),
        ("conv2", "Conv"),
        ("fc1", "Gemm"),
        ("fc2_matmul", "MatMul"),
    ]


def test_example_files_are_small_and_consistent(digits):
    total = sum(Path(digits[k]).stat().st_size for k in ("model", "calib", "eval"))
    assert total < 1_000_000
    assert digits["calib_x"].shape == (200, 1, 8, 8)
    assert digits["eval_x"].shape == (400, 1, 8, 8) and digits["eval_y"].shape == (400,)
    model = onnx.load(str(digits["model"]))
    assert model.ir_version == 8 and model.opset_import[0].version == 17


def test_int64_shape_arithmetic_is_not_quantizable(pm):
    """Shape -> Add(int64) -> Reshape: the Add is not a float op, only MatMul is offered."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    zero = numpy_helper.from_array(np.zeros(2, np.int64), "zero")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Shape", ["m"], ["s"], name="shape"),
            helper.make_node("Add", ["s", "zero"], ["s2"], name="shape_add"),
            helper.make_node("Reshape", ["m", "s2"], ["y"], name="reshape"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [w, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    cap = pm.query_capability(FW, model, None, {})
    assert [name for name, _ in cap.opwise] == ["mm"]


def test_a_torch_dataloader_feeds_an_onnx_model(digits):
    """Users coming from PyTorch pass their DataLoader: batches are [x, y] lists of tensors."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lpq import TopK

    data = TensorDataset(torch.tensor(digits["eval_x"]), torch.tensor(digits["eval_y"]))
    loader = DataLoader(data, batch_size=50)
    pm = lpq.get_plugin_manager()
    result = pm.evaluate("onnxrt", digits["model"], loader, [TopK(1)])
    assert result.samples == len(digits["eval_x"])
    assert result.accuracy > 0.95


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and two cores",
)
def test_sessions_use_the_cores_a_pinned_worker_owns():
    """A parallel tuning worker pinned to one core gets a one-thread ORT pool (ORT itself
    sizes it to the whole machine); unpinned, ORT's default is kept."""
    from lpq_onnxrt.session import build_session_options

    every = os.sched_getaffinity(0)
    if len(every) == os.cpu_count():
        assert build_session_options().intra_op_num_threads == 0, "ORT's default"
    try:
        os.sched_setaffinity(0, {min(every)})
        assert build_session_options().intra_op_num_threads == 1
        assert build_session_options({"intra_op_num_threads": 2}).intra_op_num_threads == 2
    finally:
        os.sched_setaffinity(0, every)
