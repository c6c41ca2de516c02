"""Evaluation, tensor inspection and save/load of fp32 and quantized models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import lpq
from lpq import TopK
from lpq_onnxrt import persist

FW = "onnxrt"


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


@pytest.fixture
def qmodel(pm, lpq_sample_model, calib_loader) -> Any:
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    cfg = lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=100,
        options={"latency_aware": False},  # every op int8, whatever this machine's timings
    )
    return pm.quantize(FW, lpq_sample_model, cfg, calib_loader)


class _Recorder:
    name = "recorder"
    higher_is_better = True

    def reset(self) -> None:
        self.preds: list[Any] = []

    def update(self, preds: Any, labels: Any) -> None:
        self.preds.append(preds)

    def result(self) -> float:
        return float(len(self.preds))


def test_evaluate_iteration_limit_measurer_and_postprocess(pm, lpq_sample_model, eval_loader):
    seen = []

    def postprocess(preds: Any, labels: Any) -> tuple[Any, Any]:
        seen.append(preds.shape)
        return preds, labels

    measurer = lpq.LatencyMeasurer(warmup=1)
    result = pm.evaluate(
        FW,
        lpq_sample_model,
        eval_loader,
        [TopK(1), TopK(5)],
        postprocess=postprocess,
        measurer=measurer,
        iteration=3,
    )
    assert result.batches == 3 and result.samples == 300 and len(seen) == 3
    assert len(measurer.samples) == 2 and result.latency_ms is not None
    assert 0.9 < result.metrics["top1"] <= result.metrics["top5"] <= 1.0


def test_evaluate_multi_output_models_pass_a_list(pm, lpq_sample_model, digits):
    model = onnx.load(str(lpq_sample_model))
    model.graph.output.add().name = "r3"  # a second output (ORT infers its type)
    recorder = _Recorder()
    loader = lpq.ArrayLoader(digits["eval_x"][:40], digits["eval_y"][:40], batch_size=20)
    result = pm.evaluate(FW, model, loader, [recorder, TopK(1)])
    assert isinstance(recorder.preds[0], list) and len(recorder.preds[0]) == 2
    assert recorder.preds[0][0].shape == (20, 10) and recorder.preds[0][1].shape == (20, 64)
    assert result.metrics["top1"] > 0.9  # the core metric scores the first output


def test_output_names_are_in_the_order_evaluation_passes_the_outputs(pm, lpq_sample_model, qmodel):
    """``lpq_output_names``: from the file, a proto and a quantized model alike, in the
    order of the outputs a metric is given (the graph's)."""
    model = onnx.load(str(lpq_sample_model))
    first = model.graph.output[0].name
    assert pm.output_names(FW, str(lpq_sample_model)) == [first]
    model.graph.output.add().name = "r3"
    assert pm.output_names(FW, model) == [first, "r3"]
    assert pm.output_names(FW, qmodel) == [first]
    with pytest.raises(lpq.NoAdaptorError):
        pm.output_names("not-onnx", str(lpq_sample_model))


def test_session_options_come_from_the_tune_cfg(pm, qmodel, eval_loader):
    qmodel.options["intra_op_num_threads"] = 1
    assert pm.evaluate(FW, qmodel, eval_loader, [TopK(1)]).accuracy > 0.95
    qmodel.options["providers"] = ["NoSuchExecutionProvider"]
    with pytest.raises(lpq.ConfigError, match="NoSuchExecutionProvider"):
        pm.evaluate(FW, qmodel, eval_loader, [TopK(1)])


# Plans 8-bit weights (a VNNI CPU's default): the half-step bound below is for them.
@pytest.mark.cpu_flags("avx2 avx512bw avx512_vnni")
def test_inspect_fp32_and_quantized_by_fp32_names(pm, lpq_sample_model, qmodel, eval_loader):
    names = ["conv1", "conv2", "fc1"]
    fp32 = pm.inspect_tensor(FW, lpq_sample_model, eval_loader, names, "both", 2)
    int8 = pm.inspect_tensor(FW, qmodel, eval_loader, names, "both", 2)
    for name in names:
        assert len(fp32.activations[name]) == len(int8.activations[name]) == 2
        a, b = fp32.activations[name][0], int8.activations[name][0]
        assert a.shape == b.shape and b.dtype == np.float32
        # quantization error is small but real
        rel = np.linalg.norm(a - b) / np.linalg.norm(a)
        assert 0 < rel < 0.2, (name, rel)
    w32 = fp32.weights["conv2"]["conv2.weight"]
    w8 = int8.weights["conv2"]["conv2.weight"]
    assert w8.dtype == np.float32 and w8.shape == w32.shape
    # per-channel symmetric int8: error at most half a step per channel
    step = np.abs(w32).reshape(32, -1).max(axis=1) / 127
    assert np.all(np.abs(w8 - w32).reshape(32, -1).max(axis=1) <= step * 0.51)
    assert not np.array_equal(w8, w32)


def _squeeze_excite() -> onnx.ModelProto:
    """x * sigmoid(conv(relu(conv(avgpool(x))))): MobileNetV3 / PP-OCRv4 det's block."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name: str, out: int, inp: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, 0.3, (out, inp, 1, 1)).astype("f4"), name)

    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
        helper.make_node("Conv", ["g", "w1"], ["c1"], name="conv_a"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu_a"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv_b"),
        helper.make_node("Sigmoid", ["c2"], ["s"], name="sig"),
        helper.make_node("Mul", ["x", "s"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "squeeze_excite",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, 6, 6])],
        [weight("w1", 4, 8), weight("w2", 8, 4)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inspect_qoperator_conv_whose_relu_ort_dropped(pm):
    """In QOperator, ORT folds the Relu after ``conv_a`` into its QLinearConv, which keeps
    the conv's own output name; the fp32 op's output is the Relu's. Inspection still
    finds it (PP-OCRv4 det tuning fell back to ranking ops by trials over this)."""
    model = _squeeze_excite()
    x = np.random.default_rng(1).normal(0, 1, (64, 8, 6, 6)).astype(np.float32)
    loader = lpq.ArrayLoader(x, batch_size=8)
    cap = pm.query_capability(FW, model, loader, {})
    cfg = lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=64,
        options={"quant_format": "qoperator"},
    )
    qmodel = pm.quantize(FW, model, cfg, loader)
    assert "conv_a_quant" in {node.name for node in qmodel.proto.graph.node}
    names = ["conv_a", "conv_b", "mul"]
    fp32 = pm.inspect_tensor(FW, model, loader, names, "activation", 1)
    int8 = pm.inspect_tensor(FW, qmodel, loader, names, "activation", 1)
    for name in names:
        a, b = fp32.activations[name][0], int8.activations[name][0]
        assert a.shape == b.shape, name
        assert 0 < np.linalg.norm(a - b) / np.linalg.norm(a) < 0.1, name
    assert int8.activations["conv_a"][0].min() >= 0  # the Relu's output, as in fp32


def test_inspect_unknown_node_is_a_config_error(pm, lpq_sample_model, eval_loader):
    with pytest.raises(lpq.ConfigError, match="nope"):
        pm.inspect_tensor(FW, lpq_sample_model, eval_loader, ["nope"], "activation", 1)


def test_saved_model_keeps_tune_cfg_and_ranges(pm, qmodel, tmp_path, eval_loader):
    written = pm.save_model(FW, qmodel, tmp_path / "out" / "digits-int8")
    assert written == tmp_path / "out" / "digits-int8.onnx" and written.is_file()
    assert not list((tmp_path / "out").glob(".*.tmp"))  # no temporary left behind
    meta = {p.key: p.value for p in onnx.load(str(written)).metadata_props}
    assert json.loads(meta["lpq.tune_cfg"]) == qmodel.tune_cfg.to_json()
    loaded = pm.load_model(FW, written)
    assert loaded.tune_cfg.fingerprint() == qmodel.tune_cfg.fingerprint()
    assert loaded.ranges == qmodel.ranges  # JSON round-trips Python floats exactly
    # the file is a plain ONNX model any ORT runs
    ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
    assert (
        pm.evaluate(FW, loaded, eval_loader, [TopK(1)]).accuracy
        == pm.evaluate(FW, qmodel, eval_loader, [TopK(1)]).accuracy
    )


def test_fp32_models_save_and_load_as_protos(pm, lpq_sample_model, tmp_path):
    written = pm.save_model(FW, lpq_sample_model, tmp_path / "fp32.onnx")
    loaded = pm.load_model(FW, written)
    assert isinstance(loaded, onnx.ModelProto) and len(loaded.graph.node) == 10


def test_large_models_are_saved_with_external_data(pm, qmodel, tmp_path, monkeypatch, eval_loader):
    monkeypatch.setattr(persist, "EXTERNAL_ABOVE", 1000)  # treat the digits net as "large"
    written = pm.save_model(FW, qmodel, tmp_path / "big.onnx")
    data = tmp_path / "big.onnx.data"
    assert data.is_file() and data.stat().st_size > written.stat().st_size
    loaded = pm.load_model(FW, written)
    assert pm.evaluate(FW, loaded, eval_loader, [TopK(1)]).accuracy > 0.95


def test_loading_corrupt_or_damaged_files(pm, tmp_path, qmodel):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x08\x12\xff\xff garbage")
    with pytest.raises(lpq.ModelError):
        pm.load_model(FW, bad)
    written = pm.save_model(FW, qmodel, tmp_path / "q.onnx")
    proto = onnx.load(str(written))
    for prop in proto.metadata_props:
        if prop.key == "lpq.tune_cfg":
            prop.value = "{not json"
    Path(written).write_bytes(proto.SerializeToString())
    with pytest.raises(lpq.ModelError, match="metadata is damaged"):
        pm.load_model(FW, written)
