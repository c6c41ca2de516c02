"""The ``auto`` activation range algorithm: chosen by output error, explicit ones kept."""

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


def _choose(errors: dict[str, float]) -> str:
    """range_choice.choose with scripted output errors per candidate."""
    built = {name: onnx.ModelProto(doc_string=name) for name in errors}
    return range_choice.choose(
        lambda name: built[name], lambda model: errors[model.doc_string], tuple(errors)
    ).algorithm


def test_choose_keeps_minmax_unless_a_clipping_algorithm_is_clearly_better():
    assert _choose({"minmax": 1.0, "percentile": 0.5, "mse": 0.7}) == "percentile"
    assert _choose({"minmax": 1.0, "percentile": 0.9, "mse": 0.6}) == "mse"
    # 1% better on the calibration data itself: noise, minmax stays.
    assert _choose({"minmax": 1.0, "percentile": 0.99, "mse": 1.2}) == "minmax"
    assert _choose({"minmax": 0.3, "percentile": 0.5, "mse": 0.4}) == "minmax"


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
    feeds, found = error_feeds(prepared, cfg, loader)
    return output_error(cfg.options, feeds, prepared, found)(model)


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


def test_no_resolved_config_after_latency_decisions(pm, lpq_sample_model, calib_loader):
    cfg = _default_cfg(pm, lpq_sample_model, calib_loader).with_options(
        {"latency_aware": True, "latency_budget_s": 0.05}
    )
    result = pm.quantize(FW, lpq_sample_model, cfg, calib_loader)
    assert result.latency is not None and result.range_choice is not None
    assert pm.resolved_config(FW, result) is None


# --------------------------------------------------------------------------- narrowing


def _narrow(errors: Any, tensors: list[str]) -> dict[str, float]:
    """range_choice.narrow with scripted errors: the "model" carries the scales it was
    built with, and ``errors(scales)`` gives its output error on each of two parts of the
    calibration data."""
    import json

    def build(scales: dict[str, float]) -> onnx.ModelProto:
        return onnx.ModelProto(doc_string=json.dumps(scales, sort_keys=True))

    def check(part: int) -> Any:
        return lambda model: float(errors(json.loads(model.doc_string))[part])

    return range_choice.narrow(tensors, build, [check(0), check(1)])


def test_narrow_keeps_a_fraction_only_when_it_clearly_cuts_the_error_on_every_part():
    def errors(scales: dict[str, float]) -> tuple[float, float]:
        error = 1.0
        error *= {0.7: 0.8, 0.5: 0.4, 0.35: 0.6}.get(scales.get("a", 1.0), 1.0)
        error *= 0.98 if "b" in scales else 1.0  # a 2% gain: noise, not kept
        if "c" in scales:  # helps only once "a" is narrowed
            error *= 0.5 if "a" in scales else 1.5
        return error, error

    # "a": its best fraction; "b": left; "c": every fraction ties, the widest is kept.
    assert _narrow(errors, ["a", "b", "c"]) == {"a": 0.5, "c": 0.7}
    assert _narrow(errors, ["b", "c"]) == {}


def test_narrow_leaves_a_fraction_that_helps_on_one_part_only():
    def errors(scales: dict[str, float]) -> tuple[float, float]:
        if "fitted" in scales:  # much better on part 0, a little worse on part 1
            return 0.2, 1.01
        return 1.0, 1.0

    assert _narrow(errors, ["fitted"]) == {}


def test_resolve_takes_the_algorithm_that_narrows_best():
    """kl is best unnarrowed; minmax narrowed beats kl narrowed, so minmax is chosen."""
    auto = lpq.OpConfig(
        precision="int8",
        mode="static",
        activation=lpq.TensorConfig("uint8", "asym", algorithm=range_choice.AUTO),
    )
    unnarrowed = {"minmax": 1.0, "percentile": 0.9, "mse": 0.9, "kl": 0.5}

    def build(plan: dict[str, lpq.OpConfig], scales: dict[str, float]) -> onnx.ModelProto:
        algorithm = plan["op"].activation.algorithm
        return onnx.ModelProto(doc_string=f"{algorithm} {'t' in scales}")

    def error(model: onnx.ModelProto) -> float:
        algorithm, narrowed = model.doc_string.split()
        if narrowed == "True":
            return {"minmax": 0.1, "kl": 0.4}.get(algorithm, 1.0)
        return unnarrowed[algorithm]

    plan, choice = range_choice.resolve({"op": auto}, build, error)
    assert choice is not None and choice.algorithm == "kl" and not choice.narrowed
    both = range_choice.Narrowing(["t"], [error, error])
    plan, choice = range_choice.resolve({"op": auto}, build, error, both)
    assert choice is not None and choice.algorithm == "minmax"
    assert choice.narrowed == {"t": max(range_choice.NARROW_FACTORS)}
    assert choice.narrowed_error == pytest.approx(0.1)
    assert plan["op"].activation.algorithm == "minmax"


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
