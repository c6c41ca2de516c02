"""The ``auto`` activation range algorithm on real ONNX models: chosen by output error,
explicit ones kept, narrowing on a small model. The rule itself (tie rule, gains, parts)
is core's, tested with a scripted backend in tests/test_range_choice.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpq
from lpq_onnxrt import range_choice

FW = "onnxrt"


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


def _default_cfg(pm: lpq.PluginManager, model: Any, loader: Any, samples: int = 64) -> Any:
    cap = pm.query_capability(FW, model, loader, {})
    return lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=samples,
        options={"quant_format": "qdq"},
    )


def _algorithms(cfg: lpq.TuneConfig) -> set[str]:
    return {c.activation.algorithm for c in cfg.ops.values() if c.quantized and c.activation}


def _measured_error(model: onnx.ModelProto, fp32: Any, cfg: lpq.TuneConfig, loader: Any) -> float:
    """``model``'s output error as quantize measures it (same calibration batches)."""
    from lpq_onnxrt import model_io
    from lpq_onnxrt.latency.fidelity import error_feeds, output_error

    prepared = model_io.prepare(fp32).model
    feeds, found, batched = error_feeds(prepared, cfg, loader)
    return output_error(cfg.options, feeds, prepared, found, batched=batched)(model)


def test_default_is_auto_and_the_result_records_what_it_resolved_to(
    pm, lpq_sample_model, calib_loader
):
    cfg = _default_cfg(pm, lpq_sample_model, calib_loader)
    assert _algorithms(cfg) == {range_choice.AUTO}
    result = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    choice = result.range_choice
    assert set(choice["errors"]) == set(range_choice.CANDIDATES)
    # Every static op of the returned tune_cfg names the algorithm its ranges came from.
    assert _algorithms(result.tune_cfg) == {choice["algorithm"]}
    # The error recorded for the choice is the quantized model's own output error.
    measured = _measured_error(result.proto, lpq_sample_model, cfg, calib_loader)
    recorded = choice["narrowed_error"] if choice["narrowed"] else None
    if recorded is None:
        recorded = choice["errors"][choice["algorithm"]]
    assert measured == pytest.approx(recorded, rel=1e-4, abs=1e-9)


def test_an_explicit_algorithm_is_never_replaced(pm, lpq_sample_model, calib_loader):
    cfg = _default_cfg(pm, lpq_sample_model, calib_loader)
    explicit = cfg.with_ops(
        {key: range_choice.with_algorithm(c, "kl") for key, c in cfg.ops.items() if c.quantized}
    )
    result = pm.quantize(FW, lpq_sample_model, explicit, calib_loader)
    assert result.range_choice is None
    assert _algorithms(result.tune_cfg) == {"kl"}


def _saturating_model() -> onnx.ModelProto:
    """x -> Sigmoid -> MatMul -> y: a spike in x saturates the sigmoid (clipping it costs
    nothing) but stretches a minmax range of x for every sample."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (256, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
            helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
        ],
        "saturating",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_auto_clips_a_range_that_minmax_stretches(pm):
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (512, 256)).astype(np.float32)
    x[100, 7] = 1000.0  # one value in 131072, as a long calibration stream can have
    loader = lpq.ArrayLoader(x, batch_size=16)
    model = _saturating_model()
    result = pm.quantize(FW, model, _default_cfg(pm, model, loader, samples=512), loader)
    choice = result.range_choice
    assert choice["algorithm"] != "minmax"
    assert choice["errors"][choice["algorithm"]] < 0.5 * choice["errors"]["minmax"]
    assert result.ranges["x"][1] < 10.0  # read from the quantized model's ranges


def test_the_resolved_config_quantizes_to_the_same_model(pm, lpq_sample_model, calib_loader):
    """``lpq_resolved_config`` spells out what ``auto`` chose; quantized again, that config
    gives the same model, so the tuner may answer a proposal of it from this trial."""
    cfg = _default_cfg(pm, lpq_sample_model, calib_loader)
    result = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    resolved = pm.resolved_config(FW, result)
    assert resolved is not None and resolved.fingerprint() != cfg.fingerprint()
    assert _algorithms(resolved) == {result.range_choice["algorithm"]}
    again = pm.quantize(FW, lpq_sample_model, resolved, calib_loader)
    assert again.range_choice is None  # nothing left to resolve
    assert again.proto.SerializeToString() == result.proto.SerializeToString()


def test_after_latency_decisions_the_resolved_config_is_the_decided_model(
    pm, lpq_sample_model, calib_loader
):
    """After latency-aware decisions the resolved config spells them out (ops kept fp32 or
    dynamic, the format) with latency_aware off: quantized again, it gives the same model
    without measuring anything."""
    cfg = _default_cfg(pm, lpq_sample_model, calib_loader).with_options(
        {"latency_aware": True, "latency_budget_s": 0.05}
    )
    result = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    assert result.latency is not None and result.range_choice is not None
    resolved = pm.resolved_config(FW, result)
    assert resolved is not None and resolved.options["latency_aware"] is False
    assert resolved.options["quant_format"] == result.latency["quant_format"]
    again = pm.quantize(FW, lpq_sample_model, resolved, calib_loader)
    assert again.latency is None  # nothing measured
    assert again.proto.SerializeToString() == result.proto.SerializeToString()


# --------------------------------------------------------------------------- narrowing


def _wide_model() -> onnx.ModelProto:
    """x -> MatMul -> y -> Tanh: one column of y is 30x the others. Its values stretch
    y's range, and the tanh that follows saturates on them, so clipping them costs nothing
    while the range's step rounds the other columns away."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (16, 8)).astype(np.float32)
    w[:, 0] *= 30
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
            helper.make_node("Tanh", ["y"], ["t"], name="tanh"),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_auto_narrows_a_range_stretched_by_values_the_model_discards(pm):
    x = np.random.default_rng(1).normal(0, 1, (256, 16)).astype(np.float32)
    loader = lpq.ArrayLoader(x, batch_size=16)
    model = _wide_model()
    cfg = _default_cfg(pm, model, loader, samples=256)
    result = pm.quantize(FW, model, cfg, loader)
    choice = result.range_choice
    assert set(choice["narrowed"]) == {"y"}
    unnarrowed = choice["errors"][choice["algorithm"]]
    assert choice["narrowed_error"] < 0.5 * unnarrowed
    # What the model runs with: measured, and y's range is the narrowed one.
    assert _measured_error(result.proto, model, cfg, loader) == pytest.approx(
        choice["narrowed_error"], rel=1e-4
    )
    explicit = pm.quantize(
        FW,
        model,
        pm.resolved_config(FW, result).with_options({range_choice.SCALES_OPTION: {}}),
        loader,
    )
    wide, narrow = explicit.ranges["y"], result.ranges["y"]
    assert narrow[1] - narrow[0] == pytest.approx(choice["narrowed"]["y"] * (wide[1] - wide[0]))
    # The factor is in the returned tune_cfg: quantized again, the same model.
    resolved = pm.resolved_config(FW, result)
    assert resolved.options[range_choice.SCALES_OPTION] == choice["narrowed"]
    again = pm.quantize(FW, model, resolved, loader)
    assert again.proto.SerializeToString() == result.proto.SerializeToString()


@pytest.mark.parametrize("value", [{"y": 0.0}, {"y": 1.5}, ["y"], {"y": "half"}])
def test_a_bad_range_scales_option_is_a_config_error(pm, value):
    x = np.random.default_rng(1).normal(0, 1, (64, 16)).astype(np.float32)
    loader = lpq.ArrayLoader(x, batch_size=16)
    model = _wide_model()
    cfg = _default_cfg(pm, model, loader).with_options({range_choice.SCALES_OPTION: value})
    with pytest.raises(lpq.ConfigError, match=range_choice.SCALES_OPTION):
        pm.quantize(FW, model, cfg, loader)


# Narrowing runs only where ``lpq.ranges.narrowing_pays`` says so: on the calibration
# statistics' count of activation values.


def _quantize_wide(pm: Any) -> Any:
    x = np.random.default_rng(1).normal(0, 1, (256, 16)).astype(np.float32)
    loader = lpq.ArrayLoader(x, batch_size=16)
    model = _wide_model()
    cap = pm.query_capability(FW, model, loader, {})
    cfg = lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=256,
        options={"latency_aware": False},
    )
    return pm.quantize(FW, model, cfg, loader)


def test_narrowing_runs_within_the_value_budget_and_not_above(monkeypatch):
    from lpq_onnxrt.passes import static_plan

    pm = lpq.get_plugin_manager()
    seen: list[tuple[int, int]] = []
    original = static_plan.range_choice.narrowing_pays

    def recorded(ops: int, values: int) -> bool:
        seen.append((ops, values))
        return bool(original(ops, values))

    monkeypatch.setattr(static_plan.range_choice, "narrowing_pays", recorded)
    narrowed = _quantize_wide(pm).range_choice
    # x and y over 256 samples: the values the calibration computed
    assert seen and seen[-1] == (1, 256 * (16 + 8))
    assert narrowed["narrowed"] == {"y": narrowed["narrowed"]["y"]}
    assert narrowed["narrowed_error"] is not None
    monkeypatch.setattr("lpq.ranges.choice.NARROW_MAX_VALUES", seen[-1][1] - 1)
    plain = _quantize_wide(pm).range_choice
    assert plain["narrowed"] == {} and plain["narrowed_error"] is None  # not run
    assert plain["errors"] == narrowed["errors"]  # the algorithm choice is unchanged
