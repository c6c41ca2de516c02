"""Quantize real models with ORT, run them, and check accuracy and the quantized graph."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import lpq
from lpq import TopK

FW = "onnxrt"


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


def _cfg(cap: lpq.FrameworkCapability, mode: str = "static", **options: Any) -> lpq.TuneConfig:
    """The first config of ``mode`` for every op that has one (others stay fp32).

    Latency-aware quantization is off: these tests check how each config maps onto the
    graph, which must not depend on timings (test_onnxrt_latency.py tests the decisions).
    """
    ops = {}
    for key in cap.opwise:
        ops[key] = next((c for c in cap.op_configs(key) if c.mode == mode), lpq.OpConfig.fallback())
    return lpq.TuneConfig(
        ops=ops, calib_sampling_size=200, options={"latency_aware": False, **options}
    )


def _ops(model: Any) -> Counter[str]:
    return Counter(node.op_type for node in model.proto.graph.node)


def _inits(model: Any) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.proto.graph.initializer}


def _accuracy(pm: lpq.PluginManager, model: Any, loader: Any) -> float:
    return pm.evaluate(FW, model, loader, [TopK(1)]).accuracy


def test_default_static_qdq_is_u8s8_per_channel_and_accurate(
    pm, lpq_sample_model, calib_loader, eval_loader
):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    qmodel = pm.quantize(FW, lpq_sample_model, _cfg(cap), calib_loader)
    onnx.checker.check_model(qmodel.proto)
    fp32 = _accuracy(pm, lpq_sample_model, eval_loader)
    assert fp32 >= 0.95
    assert _accuracy(pm, qmodel, eval_loader) >= fp32 - 0.01
    inits = _inits(qmodel)
    # uint8 activations: every activation zero point is uint8.
    act_zps = [inits[n.input[2]] for n in qmodel.proto.graph.node if n.op_type == "QuantizeLinear"]
    assert act_zps and all(zp.dtype == np.uint8 for zp in act_zps)
    # int8 per-channel weights: one scale per output channel, axis on the DQ node.
    assert inits["conv2.weight_quantized"].dtype == np.int8
    assert inits["conv2.weight_scale"].shape == (64,)  # conv2 has 64 output channels
    dq = next(n for n in qmodel.proto.graph.node if n.input[0] == "conv2.weight_quantized")
    assert any(a.name == "axis" for a in dq.attribute) or inits["conv2.weight_scale"].size > 1
    assert np.all(inits["conv2.weight_zero_point"] == 0)  # symmetric


def test_fallback_op_stays_fp32(pm, lpq_sample_model, calib_loader, eval_loader):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    cfg = _cfg(cap).with_ops({("conv2", "Conv"): lpq.OpConfig.fallback()})
    qmodel = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    inits = _inits(qmodel)
    assert "conv2.weight" in inits and inits["conv2.weight"].dtype == np.float32
    assert "conv2.weight_quantized" not in inits
    assert "conv1.weight_quantized" in inits and "fc1.weight_quantized" in inits
    assert _accuracy(pm, qmodel, eval_loader) >= 0.95


def test_per_op_dtype_scheme_and_granularity_are_honoured(pm, lpq_sample_model, calib_loader):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    base = _cfg(cap)
    conv1 = base.ops[("conv1", "Conv")]
    changed = replace(
        conv1,
        weight=replace(conv1.weight, granularity="per_tensor"),
        activation=replace(conv1.activation, dtype="int8", scheme="sym"),
    )
    qmodel = pm.quantize(
        FW, lpq_sample_model, base.with_ops({("conv1", "Conv"): changed}), calib_loader
    )
    inits = _inits(qmodel)
    assert inits["conv1.weight_scale"].size == 1  # per tensor
    assert inits["conv2.weight_scale"].size == 64  # still per channel
    # conv1's input activation: int8, symmetric (zero point 0); the rest stays uint8.
    q_input = next(
        n
        for n in qmodel.proto.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] == "input"
    )
    assert inits[q_input.input[2]].dtype == np.int8 and inits[q_input.input[2]] == 0
    q_r2 = next(
        n for n in qmodel.proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "r2"
    )
    assert inits[q_r2.input[2]].dtype == np.uint8


def test_qoperator_format_produces_qlinear_ops(pm, lpq_sample_model, calib_loader, eval_loader):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    qmodel = pm.quantize(FW, lpq_sample_model, _cfg(cap, quant_format="qoperator"), calib_loader)
    ops = _ops(qmodel)
    assert ops["QLinearConv"] == 2 and ops["Conv"] == 0
    assert _accuracy(pm, qmodel, eval_loader) >= 0.95


def test_dynamic_matmul(pm, mlp_model, calib_loader, eval_loader):
    cap = pm.query_capability(FW, mlp_model, None, {})
    assert set(cap.opwise) == {("mm1", "MatMul"), ("mm2", "MatMul")}
    qmodel = pm.quantize(FW, mlp_model, _cfg(cap, "dynamic"), None)  # no calibration data
    ops = _ops(qmodel)
    assert ops["DynamicQuantizeLinear"] == 2 and ops["MatMulInteger"] == 2
    assert ops["MatMul"] == 0
    fp32 = _accuracy(pm, mlp_model, eval_loader)
    assert fp32 >= 0.93
    assert _accuracy(pm, qmodel, eval_loader) >= fp32 - 0.02


@pytest.mark.parametrize("precision", ["int4", "uint4"])
def test_int4_weight_only_matmul(pm, mlp_model, eval_loader, precision):
    cap = pm.query_capability(FW, mlp_model, None, {})
    ops = {}
    for key in cap.opwise:
        ops[key] = next(
            c
            for c in cap.op_configs(key)
            if c.precision == precision and c.weight.options["block_size"] == 32
        )
    qmodel = pm.quantize(FW, mlp_model, lpq.TuneConfig(ops=ops), None)
    nbits = [n for n in qmodel.proto.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and _ops(qmodel)["MatMul"] == 0
    attrs = {a.name: a.i for a in nbits[0].attribute}
    assert attrs["bits"] == 4 and attrs["block_size"] == 32
    fp32 = _accuracy(pm, mlp_model, eval_loader)
    assert _accuracy(pm, qmodel, eval_loader) >= fp32 - 0.04


def test_mixed_modes_in_one_model(pm, mlp_model, calib_loader, eval_loader):
    cap = pm.query_capability(FW, mlp_model, None, {})
    static = next(c for c in cap.op_configs(("mm1", "MatMul")) if c.mode == "static")
    dynamic = next(c for c in cap.op_configs(("mm2", "MatMul")) if c.mode == "dynamic")
    cfg = lpq.TuneConfig(ops={("mm1", "MatMul"): static, ("mm2", "MatMul"): dynamic})
    qmodel = pm.quantize(FW, mlp_model, cfg, calib_loader)
    ops = _ops(qmodel)
    assert ops["MatMulInteger"] == 1 and ops["QuantizeLinear"] >= 1
    assert _accuracy(pm, qmodel, eval_loader) >= 0.93


def test_fp16_fallback_inserts_casts_and_runs(pm, lpq_sample_model, calib_loader, eval_loader):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    assert "fp16" in cap.fallback_precisions(("conv2", "Conv"))
    cfg = _cfg(cap).with_ops({("conv2", "Conv"): lpq.OpConfig.fallback("fp16")})
    qmodel = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    conv2 = next(n for n in qmodel.proto.graph.node if n.name == "conv2")
    inits = _inits(qmodel)
    assert all(not name.endswith("_quantized") for name in conv2.input)
    assert _ops(qmodel)["Cast"] >= 2
    assert "conv2.weight_quantized" not in inits
    assert _accuracy(pm, qmodel, eval_loader) >= 0.95


def test_convert_bf16_without_kernel_is_a_model_error(pm, lpq_sample_model):
    cap = pm.query_capability(FW, lpq_sample_model, None, {})
    assert "bf16" not in cap.fallback_precisions(("conv1", "Conv"))
    with pytest.raises(lpq.ModelError, match="no kernel"):
        pm.convert_bf16(FW, lpq_sample_model, ["conv1"], "bf16")


def test_convert_fp16_runs(pm, lpq_sample_model, eval_loader):
    converted = pm.convert_bf16(FW, lpq_sample_model, ["conv1", "fc1"], "fp16")
    types = {n.name: n for n in converted.graph.node}
    assert types["conv1"].input[0].endswith("__lpq_fp16_conv1")
    assert _accuracy(pm, converted, eval_loader) >= 0.95


def test_old_opset_is_upgraded_for_per_channel(pm, lpq_sample_model, calib_loader, eval_loader):
    model = onnx.load(str(lpq_sample_model))
    model.opset_import[0].version = 11  # the ops used mean the same at opset 11
    onnx.checker.check_model(model)
    cap = pm.query_capability(FW, model, calib_loader, {})
    qmodel = pm.quantize(FW, model, _cfg(cap), calib_loader)
    opset = next(o.version for o in qmodel.proto.opset_import if o.domain in ("", "ai.onnx"))
    assert opset >= 13  # DequantizeLinear's axis needs opset 13
    onnx.checker.check_model(qmodel.proto, full_check=True)
    assert _accuracy(pm, qmodel, eval_loader) >= 0.95
    assert model.opset_import[0].version == 11  # the input was not modified


def test_input_model_is_not_modified(pm, lpq_sample_model, calib_loader):
    model = onnx.load(str(lpq_sample_model))
    before = model.SerializeToString()
    cap = pm.query_capability(FW, model, calib_loader, {})
    pm.quantize(FW, model, _cfg(cap), calib_loader)
    assert model.SerializeToString() == before


def test_calibration_is_cached_across_fallback_trials(
    pm, lpq_sample_model, calib_loader, monkeypatch
):
    import lpq_onnxrt.calibration as calibration

    calls: list[int] = []
    original = calibration.collect_statistics

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(calibration, "collect_statistics", counting)
    lpq.run_cache().clear_memory()
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    cfg = _cfg(cap)
    pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    pm.quantize(
        FW, lpq_sample_model, cfg.with_ops({("fc1", "Gemm"): lpq.OpConfig.fallback()}), calib_loader
    )
    conv1 = cfg.ops[("conv1", "Conv")]
    kl = replace(conv1, activation=replace(conv1.activation, algorithm="kl"))
    pm.quantize(FW, lpq_sample_model, cfg.with_ops({("conv1", "Conv"): kl}), calib_loader)
    assert len(calls) == 1
    pm.quantize(FW, lpq_sample_model, replace(cfg, calib_sampling_size=100), calib_loader)
    assert len(calls) == 2  # a different sample count is a different calibration


def test_calibration_uses_exactly_calib_sampling_size(
    pm, lpq_sample_model, calib_loader, monkeypatch
):
    import lpq_onnxrt.calibration as calibration

    seen: list[int] = []
    original = calibration.collect_statistics

    def counting(model: Any, names: Any, feeds: Any, **kwargs: Any) -> Any:
        def tap() -> Any:
            for feed in feeds:
                seen.append(len(feed["input"]))
                yield feed

        return original(model, names, tap(), **kwargs)

    monkeypatch.setattr(calibration, "collect_statistics", counting)
    lpq.run_cache().clear_memory()
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    pm.quantize(FW, lpq_sample_model, replace(_cfg(cap), calib_sampling_size=70), calib_loader)
    assert sum(seen) == 70  # batches of 50: one full batch and 20 of the next


def test_algorithms_give_different_ranges(pm, lpq_sample_model, calib_loader):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    cfg = _cfg(cap)
    found = {}
    for algorithm in ("minmax", "percentile", "kl"):
        ops = {
            key: replace(c, activation=replace(c.activation, algorithm=algorithm))
            for key, c in cfg.ops.items()
        }
        found[algorithm] = pm.quantize(
            FW, lpq_sample_model, replace(cfg, ops=ops), calib_loader
        ).ranges
    assert set(found["minmax"]) == set(found["kl"])
    r2 = [found[a]["r2"] for a in ("minmax", "percentile", "kl")]
    assert r2[0][1] >= r2[1][1] and r2[0][1] >= r2[2][1]  # clipping never widens
    assert r2[0] != r2[2]


def test_unknown_node_in_tune_cfg_is_a_config_error(pm, lpq_sample_model, calib_loader):
    cfg = lpq.TuneConfig(ops={("nope", "Conv"): lpq.OpConfig.fallback()})
    with pytest.raises(lpq.ConfigError, match="nope"):
        pm.quantize(FW, lpq_sample_model, cfg, calib_loader)


def test_static_without_data_is_a_data_error(pm, lpq_sample_model):
    cap = pm.query_capability(FW, lpq_sample_model, None, {})
    with pytest.raises(lpq.DataError, match="calibration data"):
        pm.quantize(FW, lpq_sample_model, _cfg(cap), None)


def test_gemm_with_2d_bias_quantizes_per_channel(pm):
    """Models converted from JAX/TF carry Gemm biases of shape (1, N); ORT's QDQ
    quantizer crashes on them with per-channel weights unless they are flattened."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (16, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, (1, 8)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="gemm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.normal(0, 1, (64, 16)).astype(np.float32)
    loader = lpq.ArrayLoader(x, batch_size=16)
    cap = pm.query_capability(FW, model, loader, {})
    qmodel = pm.quantize(FW, model, _cfg(cap), loader)
    assert _inits(qmodel)["w_scale"].shape == (8,)
    ref = x @ numpy_helper.to_array(w) + numpy_helper.to_array(b)
    got = []
    pm.evaluate(FW, qmodel, [(x, ref)], [_Collect(got)])
    assert np.abs(got[0] - ref).max() < 0.05 * np.abs(ref).max()


class _Collect:
    name = "collect"
    higher_is_better = True

    def __init__(self, into: list[Any]) -> None:
        self.into = into

    def reset(self) -> None:
        self.into.clear()

    def update(self, preds: Any, labels: Any) -> None:
        self.into.append(preds)

    def result(self) -> float:
        return 0.0


def test_dynamic_gather_and_conv(pm):
    """Embedding lookup and a 1-D conv quantized dynamically (no calibration data)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.normal(0, 1, (50, 16)).astype(np.float32), "emb")
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 16, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "ids"], ["e"], name="gather"),
            helper.make_node("Transpose", ["e"], ["et"], name="tr", perm=[0, 2, 1]),
            helper.make_node("Conv", ["et", "w"], ["y"], name="conv", pads=[1, 1]),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 10])],
        [emb, w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    cap = pm.query_capability(FW, model, None, {})
    assert set(cap.opwise) == {("gather", "Gather"), ("conv", "Conv")}
    qmodel = pm.quantize(FW, model, _cfg(cap, "dynamic"), None)
    ops = _ops(qmodel)
    assert ops["ConvInteger"] == 1 and ops["Conv"] == 0
    assert _inits(qmodel)["emb_quantized"].dtype in (np.int8, np.uint8)
    ids = rng.integers(0, 50, (8, 10))
    ref: list[Any] = []
    got: list[Any] = []
    pm.evaluate(FW, model, [{"ids": ids}], [_Collect(ref)])
    pm.evaluate(FW, qmodel, [{"ids": ids}], [_Collect(got)])
    assert np.abs(got[0] - ref[0]).max() < 0.05 * np.abs(ref[0]).max()


def test_fallback_gemm_stays_float_in_a_default_ort_session(pm):
    """ORT's WeightBiasQuantization transformer quantizes the float weights of any Gemm
    that reads a DequantizeLinear output, at session load. A fallback Gemm therefore
    reads the float tensor in front of the Q/DQ pair: it must compute exactly what the
    same graph computes with every ORT optimization off."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w0 = rng.normal(0, 0.3, (16, 16)).astype(np.float32)
    w1 = rng.normal(0, 0.3, (16, 8)).astype(np.float32)
    w1[:, 0] *= 500.0  # one huge output column: per-tensor weight quantization wrecks the rest
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w0"], ["h"], name="first"),
            helper.make_node("Gemm", ["h", "w1"], ["y"], name="second"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.normal(0, 1, (64, 16)).astype(np.float32)
    loader = lpq.ArrayLoader(x, batch_size=16)
    cap = pm.query_capability(FW, model, loader, {})
    cfg = _cfg(cap).with_ops({("second", "Gemm"): lpq.OpConfig.fallback()})
    qmodel = pm.quantize(FW, model, cfg, loader)

    second = next(n for n in qmodel.proto.graph.node if n.name == "second")
    assert second.input[0] == "h", "the fallback Gemm must read the float activation"
    assert "w1" in _inits(qmodel), "its weight stays a float initializer"
    data = qmodel.proto.SerializeToString()
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(data, plain, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_quantized_ops_reads_what_ort_runs(pm, lpq_sample_model, calib_loader, fmt):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    cfg = _cfg(cap, quant_format=fmt).with_ops({("conv2", "Conv"): lpq.OpConfig.fallback()})
    qmodel = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    found = pm.quantized_ops(FW, qmodel)
    assert set(found) == {name for name, _ in cap.opwise}
    assert found["conv2"] == "fp32"
    assert found["conv1"] == "int8"
    assert set(found.values()) <= {"int8", "fp32"}


def test_quantized_ops_reports_fp16_and_int4(pm, mlp_model, lpq_sample_model, calib_loader):
    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    cfg = _cfg(cap).with_ops({("conv2", "Conv"): lpq.OpConfig.fallback("fp16")})
    assert (
        pm.quantized_ops(FW, pm.quantize(FW, lpq_sample_model, cfg, calib_loader))["conv2"]
        == "fp16"
    )
    cap = pm.query_capability(FW, mlp_model, None, {})
    ops = {key: next(c for c in cap.op_configs(key) if c.precision == "int4") for key in cap.opwise}
    found = pm.quantized_ops(FW, pm.quantize(FW, mlp_model, lpq.TuneConfig(ops=ops), None))
    assert set(found.values()) == {"int4"}


def test_quantized_ops_of_an_fp32_model_are_fp32(pm, lpq_sample_model):
    found = pm.quantized_ops(FW, str(lpq_sample_model))
    assert found and set(found.values()) == {"fp32"}


def _weight_codes(model: Any) -> list[np.ndarray]:
    """The stored integer weights (``*_quantized`` initializers ORT's quantizers write)."""
    return [
        value
        for name, value in _inits(model).items()
        if name.endswith("_quantized") and value.dtype in (np.int8, np.uint8) and value.ndim >= 2
    ]


def _reduce_range(cfg: lpq.TuneConfig, on: bool = True) -> lpq.TuneConfig:
    """``cfg`` with the capability's ``reduce_range`` knob on (or off) for every weight."""
    changed = {
        key: replace(
            op, weight=replace(op.weight, options={**op.weight.options, "reduce_range": on})
        )
        for key, op in cfg.ops.items()
        if op.weight is not None
    }
    return cfg.with_ops(changed)


@pytest.mark.parametrize(
    ("model_name", "mode", "fmt"),
    [("digits", "static", "qdq"), ("digits", "static", "qoperator"), ("mlp", "dynamic", "qdq")],
)
def test_reduce_range_quantizes_weights_to_7_bits(
    pm, lpq_sample_model, mlp_model, calib_loader, eval_loader, model_name, mode, fmt
):
    model = lpq_sample_model if model_name == "digits" else mlp_model
    data = calib_loader if mode == "static" else None
    cap = pm.query_capability(FW, model, data, {})
    base = _cfg(cap, mode, quant_format=fmt)
    assert any(op.weight is not None for op in base.ops.values())
    full = _weight_codes(pm.quantize(FW, model, _reduce_range(base, on=False), data))
    reduced_model = pm.quantize(FW, model, _reduce_range(base), data)
    reduced = _weight_codes(reduced_model)
    assert full and len(reduced) == len(full)
    # 8-bit symmetric weights reach +-127; ORT's reduce_range keeps them in [-64, 64].
    assert max(int(np.abs(q.astype(np.int32)).max()) for q in full) == 127
    assert max(int(np.abs(q.astype(np.int32)).max()) for q in reduced) <= 64
    # The 7-bit model still runs and stays accurate (on every x86 CPU: no saturation).
    fp32 = _accuracy(pm, model, eval_loader)
    assert _accuracy(pm, reduced_model, eval_loader) >= fp32 - 0.03


def test_dynamic_op_beside_a_static_op_on_the_same_input(pm, caplog):
    """A tensor read by a static op (gets a Q/DQ pair) and a dynamic op: the dynamic op
    must read the float tensor (it quantizes it itself), or ORT sees one name twice."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, w2 = (rng.normal(0, 0.3, (16, 16)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm_dynamic"),
            helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm_static"),
            helper.make_node("Add", ["a", "b"], ["y"], name="add"),
        ],
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = [rng.normal(0, 1, (8, 16)).astype(np.float32) for _ in range(4)]
    cap = pm.query_capability(FW, model, data, {})
    ops = {}
    for key in cap.opwise:
        mode = "dynamic" if key[0] == "mm_dynamic" else "static"
        ops[key] = next(c for c in cap.op_configs(key) if c.mode == mode)
    cfg = lpq.TuneConfig(ops=ops, calib_sampling_size=32, options={"latency_aware": False})
    with caplog.at_level("WARNING"):
        qmodel = pm.quantize(FW, model, cfg, data)
    assert "already quantized" not in caplog.text, "ORT's warning about a mixed plan is noise"
    kinds = Counter(node.op_type for node in qmodel.proto.graph.node)
    assert kinds["MatMulInteger"] == 1 and kinds["DequantizeLinear"] >= 1
    import onnxruntime as ort

    got = ort.InferenceSession(qmodel.proto.SerializeToString()).run(None, {"x": data[0]})[0]
    want = data[0] @ w1 + data[0] @ w2
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_clipping_range_algorithms_never_clip_a_model_output(pm):
    """A probability map, nearly all background near 0 and a few pixels near 1 (PP-OCRv4
    det's output): kl would clip the output range to the background and no pixel would
    reach a 0.5 threshold. The model's output keeps its full calibration range."""
    from onnx import TensorProto, helper

    eye = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["logits"], name="mm"),
            helper.make_node("Sigmoid", ["logits"], ["prob"], name="sigmoid"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 4])],
        [eye],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(0)
    x = rng.normal(-8.0, 1.0, (2000, 4)).astype(np.float32)
    x[rng.random(x.shape) < 0.02] = 6.0  # the rare foreground
    calib = [{"x": x[i : i + 100]} for i in range(0, len(x), 100)]
    cap = pm.query_capability(FW, model, calib, {})
    assert ("sigmoid", "Sigmoid") in cap.opwise
    cfg = _cfg(cap)
    ops = {
        key: replace(c, activation=replace(c.activation, algorithm="kl"))
        for key, c in cfg.ops.items()
    }
    qmodel = pm.quantize(FW, model, cfg.with_ops(ops), calib)
    assert _ops(qmodel)["DequantizeLinear"] >= 1  # the Sigmoid runs quantized
    got: list[Any] = []
    pm.evaluate(FW, qmodel, [{"x": np.full((1, 4), 6.0, np.float32)}], [_Collect(got)])
    assert got[0].min() > 0.9


def _optimized_op_types(proto: onnx.ModelProto, tmp_path: Any) -> Counter[str]:
    """The op types ORT runs for ``proto`` in a default (ORT_ENABLE_ALL) session."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    return Counter(node.op_type for node in optimized.graph.node)


def test_shipped_model_carries_no_inferred_shapes(pm, tmp_path):
    """A residual block (MatMul + bias, Add, LayerNormalization) behind a Reshape whose
    shape ORT cannot infer at load, as in an exported transformer. lpq's preparation
    infers it symbolically; if those shapes shipped, ORT would fuse the Adds and the
    LayerNormalization into SkipLayerNormalization, which ran MiniLM-L6 slower on CPU."""
    from onnx import TensorProto, helper

    from lpq_onnxrt import model_io

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b"),
        numpy_helper.from_array(np.ones(16, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(16, np.float32), "beta"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([8, 16], np.int64), "tail"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"], name="shape"),
            helper.make_node("Slice", ["shape", "zero", "one"], ["batch"], name="batch"),
            helper.make_node("Concat", ["batch", "tail"], ["dims"], name="dims", axis=0),
            helper.make_node("Reshape", ["x", "dims"], ["r"], name="reshape"),
            helper.make_node("MatMul", ["r", "w"], ["m"], name="matmul"),
            helper.make_node("Add", ["m", "b"], ["h"], name="bias"),
            helper.make_node("Add", ["h", "r"], ["s"], name="residual"),
            helper.make_node(
                "LayerNormalization", ["s", "gamma", "beta"], ["y"], name="norm", axis=-1
            ),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert _optimized_op_types(model, tmp_path)["SkipLayerNormalization"] == 0

    cap = pm.query_capability(FW, model, None, {})
    qmodel = pm.quantize(FW, model, _cfg(cap, "dynamic"), None)
    assert not qmodel.proto.graph.value_info
    ran = _optimized_op_types(qmodel.proto, tmp_path)
    assert ran["SkipLayerNormalization"] == 0 and ran["LayerNormalization"] == 1
    assert ran["MatMulIntegerToFloat"] + ran["DynamicQuantizeMatMul"] == 1, ran
    # The same graph with the inferred shapes put back is fused: they are what matters.
    reshaped = model_io.infer_shapes(model_io.copy_model(qmodel.proto))
    assert _optimized_op_types(reshaped, tmp_path)["SkipLayerNormalization"] == 1

    x = rng.normal(0, 1, (4, 128)).astype(np.float32)
    ref: list[Any] = []
    got: list[Any] = []
    pm.evaluate(FW, model, [{"x": x}], [_Collect(ref)])
    pm.evaluate(FW, qmodel, [{"x": x}], [_Collect(got)])
    assert np.abs(got[0] - ref[0]).max() < 0.1


def test_expected_ort_quantizer_warnings_go_to_the_debug_log(caplog):
    """ORT's quantizers warn on the root logger about the int64 shape tensors around the
    ops they quantize (122 lines in one default quantization of Silero VAD) and about the
    Q/DQ nodes a mixed plan already has; lpq expects both. Other warnings still reach
    the user."""
    import logging

    from lpq_onnxrt.passes.quantizer import quiet_quantizer

    with caplog.at_level("DEBUG"), quiet_quantizer():
        logging.warning("Inference failed or unsupported type to quantize for tensor 'g'")
        logging.warning("Please check if the model is already quantized.")
        logging.warning("something else went wrong")
    root = [r.getMessage() for r in caplog.records if r.name == "root"]
    assert root == ["something else went wrong"]
    assert any("unsupported type to quantize" in r.getMessage() for r in caplog.records)
    logging.warning("Inference failed or unsupported type to quantize for tensor 'h'")
    assert "tensor 'h'" in caplog.text, "the filter is gone once the pass is done"


def test_the_fidelity_gates_timing_rounds_make_one_session_per_model(
    pm, lpq_sample_model, calib_loader, digits, monkeypatch
):
    """The gate times fp32 and int8 in alternating rounds, one ``evaluate`` each per
    round; inside its ``lpq.runtimes_kept`` scope each model's session is made once, and
    none is held after it."""
    import gc
    import weakref

    from lpq.eval import fidelity
    from lpq_onnxrt import evaluate as evaluate_module

    cap = pm.query_capability(FW, lpq_sample_model, calib_loader, {})
    qmodel = pm.quantize(FW, lpq_sample_model, _cfg(cap), calib_loader)
    made: list[weakref.ref[Any]] = []
    create = evaluate_module.create_session

    def counted(*args: Any, **kwargs: Any) -> Any:
        session = create(*args, **kwargs)
        made.append(weakref.ref(session))
        return session

    monkeypatch.setattr(evaluate_module, "create_session", counted)
    data = lpq.ArrayLoader(digits["eval_x"][:8], batch_size=8)
    batch, (fp32_ms, int8_ms) = fidelity._timed(pm, FW, str(lpq_sample_model), qmodel, data, 1)
    assert batch == 1 and fp32_ms and int8_ms
    assert fidelity._TIMING_ROUNDS > 1 and len(made) == 2
    gc.collect()
    assert [ref() for ref in made] == [None, None]
    fidelity._timed(pm, FW, str(lpq_sample_model), qmodel, data, 1)
    assert len(made) == 4  # a new check makes its own


def test_lpq_quantize_reports_the_precisions_read_when_it_quantized(
    pm, monkeypatch, tmp_path, capsys
):
    """``lpq.quantize`` keeps the per-op precisions the adaptor read from the converted
    model (``QuantizedModel.quantized_ops``), and ``lpq quantize`` counts ops from them:
    no second ``lpq_quantized_ops`` call (an ORT session over the model, 0.25 CPU s on
    MiniLM)."""
    from lpq.cli import main
    from lpq_onnxrt import precision

    example = pm.example("digits")
    calib = lpq.load_npz(example.calib)
    result = lpq.quantize(str(example.model), lpq.PostTrainingQuantConfig(), calib)
    assert result.quantized_ops == pm.quantized_ops(FW, result.model)
    assert "int8" in set(result.quantized_ops.values())
    asked: list[Any] = []
    read = precision.quantized_ops

    def counted(model: Any) -> Any:
        asked.append(model)
        return read(model)

    monkeypatch.setattr(precision, "quantized_ops", counted)
    out = tmp_path / "q.onnx"
    code = main(["quantize", str(example.model), "--calib", str(example.calib), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "read from the model" in printed and out.is_file()
    assert len(asked) == 1  # the adaptor's own read, when it quantized
