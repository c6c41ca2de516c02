"""The static pass: ONNX Runtime's static quantizer (QDQ, or QOperator) with lpq's ranges.

Ranges come from lpq's streaming calibration, per tensor, with the algorithm and scheme
of the op that owns the tensor; per-op activation/weight dtype, scheme and per-channel
axis are passed to ORT as ``TensorQuantOverrides``. Data-movement ops between quantized
ops (Relu, MaxPool, Reshape, ...) follow their input, as ORT's own tool does. Which ops
get here, with which ranges, is :mod:`.static_plan`'s job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ModelError, OpConfig, TensorConfig, TuneConfig

from .. import graph, model_io, range_choice, ranges
from .channelwise import vectorized
from .quantizer import (
    WeightCache,
    fast_lookups,
    fast_rewiring,
    most_common,
    patch_quantize_onnx_initializer,
    per_channel,
    quant_type,
    quiet_quantizer,
    reduce_range,
    tensor_key,
    with_inferred_shapes,
)

if TYPE_CHECKING:
    import onnx

    from ..calibration import CalibrationStats

_WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1, "Gather": 0}


@dataclass
class _Defaults:
    """The settings most ops share: ORT's global activation / weight settings."""

    activation: TensorConfig
    weight: TensorConfig


def static_pass(
    model: onnx.ModelProto,
    ops: Mapping[str, OpConfig],
    tune_cfg: TuneConfig,
    stats: CalibrationStats,
    fmt: str,
    range_scales: Mapping[str, float] | None = None,
    weight_cache: WeightCache | None = None,
) -> tuple[onnx.ModelProto, dict[str, tuple[float, float]]]:
    """``ops`` of ``model`` quantized statically in ``fmt`` ("qdq" / "qoperator") with
    ranges from ``stats``; returns the model and the activation ranges used.
    ``range_scales`` narrow ranges per tensor on top of those the tune_cfg records;
    ``weight_cache`` shares quantized weights with the other builds of one quantize call
    (the same model either way)."""
    if any(per_channel(cfg) for cfg in ops.values()):
        model = model_io.upgrade_opset(model, 13)  # DequantizeLinear's axis needs opset 13
    graph.flatten_gemm_biases(model)
    configured = {name for name, _ in tune_cfg.ops}
    helpers = [
        node.name
        for node in model.graph.node
        if node.op_type in ranges.FOLLOW_OPS and node.name not in configured
    ]
    to_quantize = [*ops, *helpers]
    defaults = _Defaults(
        most_common(
            [cfg.activation for cfg in ops.values() if cfg.activation is not None],
            TensorConfig("uint8", "asym"),
        ),
        most_common(
            [cfg.weight for cfg in ops.values() if cfg.weight is not None],
            TensorConfig("int8", "sym", "per_channel"),
        ),
    )
    # Narrowed by ``auto`` on the output error (range_choice.narrow), or as recorded.
    scales = range_choice.scales_from(tune_cfg.options)
    if range_scales is not None:
        scales.update(range_scales)
    data, used, overrides = _activation_ranges(
        model, ops, to_quantize, stats, defaults.activation, scales
    )
    _add_weight_overrides(model, ops, overrides)
    built = _run_quantizer(model, to_quantize, defaults, data, overrides, fmt, weight_cache)
    return built, used


def _tensor_owners(model: onnx.ModelProto, ops: Mapping[str, OpConfig]) -> dict[str, TensorConfig]:
    """Which op's activation settings decide each tensor: its first quantized consumer,
    else its quantized producer (else, for the caller, the most common setting)."""
    owner: dict[str, TensorConfig] = {}
    for node in model.graph.node:
        cfg = ops.get(node.name)
        if cfg is not None and cfg.activation is not None:
            for name in node.input:
                owner.setdefault(name, cfg.activation)
    for node in model.graph.node:
        cfg = ops.get(node.name)
        if cfg is not None and cfg.activation is not None:
            for name in node.output:
                owner.setdefault(name, cfg.activation)
    return owner


def _activation_ranges(
    model: onnx.ModelProto,
    ops: Mapping[str, OpConfig],
    to_quantize: list[str],
    stats: CalibrationStats,
    default_act: TensorConfig,
    scales: Mapping[str, float],
) -> tuple[dict[str, Any], dict[str, tuple[float, float]], dict[str, list[dict[str, Any]]]]:
    """ORT ``TensorData`` per activation tensor, the ranges used, and overrides for the
    tensors whose owner's setting is not the default one."""
    from onnxruntime.quantization.calibrate import TensorData

    owner = _tensor_owners(model, ops)
    available = set(stats.tensor_names())
    tensors = [t for t in ranges.activation_tensors(model, to_quantize) if t in available]
    # A model output keeps every value it took in calibration: a clipping algorithm trades
    # rare values for resolution, and at the output the rare values are the answer.
    # PP-OCRv4 det's probability map, mostly background near 0, got kl range [0, 0.125]:
    # no pixel reached the 0.3 text threshold, IoU 0 (minmax: 0.91).
    outputs = {output.name for output in model.graph.output}
    overrides: dict[str, list[dict[str, Any]]] = {}
    data: dict[str, Any] = {}
    used: dict[str, tuple[float, float]] = {}
    for name in tensors:
        act = owner.get(name, default_act)
        symmetric = act.scheme == "sym"
        algorithm = "minmax" if name in outputs else act.algorithm
        try:
            if "percentile" in act.options:
                lo, hi = stats.compute_range(
                    name,
                    algorithm,
                    symmetric=symmetric,
                    percentile=float(act.options["percentile"]),
                )
            else:
                lo, hi = stats.compute_range(name, algorithm, symmetric=symmetric)
        except KeyError:
            continue
        if name in scales and name not in outputs:
            lo, hi = lo * scales[name], hi * scales[name]
        used[name] = (float(lo), float(hi))
        data[name] = TensorData(
            lowest=np.array(lo, dtype=np.float32), highest=np.array(hi, dtype=np.float32)
        )
        if tensor_key(act) != tensor_key(default_act):
            overrides[name] = [{"quant_type": quant_type(act.dtype), "symmetric": symmetric}]
    return data, used, overrides


def _add_weight_overrides(
    model: onnx.ModelProto, ops: Mapping[str, OpConfig], overrides: dict[str, list[dict[str, Any]]]
) -> None:
    """Each quantized op's weight dtype, scheme, axis and 7-bit range, as ORT overrides."""
    initializers = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        cfg = ops.get(node.name)
        index = _WEIGHT_INPUT.get(node.op_type)
        if cfg is None or cfg.weight is None or index is None or len(node.input) <= index:
            continue
        weight_name = node.input[index]
        if weight_name not in initializers or weight_name in overrides:
            continue
        entry: dict[str, Any] = {
            "quant_type": quant_type(cfg.weight.dtype),
            "symmetric": cfg.weight.scheme == "sym",
        }
        if per_channel(cfg) and len(initializers[weight_name].dims) >= 2:
            entry["axis"] = graph.weight_axis(node)
        if reduce_range(cfg.weight):
            entry["reduce_range"] = True  # 7-bit weights, for CPUs without VNNI
        overrides[weight_name] = [entry]


def _run_quantizer(
    model: onnx.ModelProto,
    to_quantize: list[str],
    defaults: _Defaults,
    data: dict[str, Any],
    overrides: dict[str, list[dict[str, Any]]],
    fmt: str,
    weight_cache: WeightCache | None = None,
) -> onnx.ModelProto:
    """ORT's QDQQuantizer (or ONNXQuantizer in QLinearOps mode for QOperator), reusing
    the weights ``weight_cache`` holds."""
    from onnxruntime.quantization import QDQQuantizer
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import QuantizationMode, update_opset_version

    extra: dict[str, Any] = {
        "TensorQuantOverrides": overrides,
        "ActivationSymmetric": defaults.activation.scheme == "sym",
        "WeightSymmetric": defaults.weight.scheme == "sym",
    }
    act_type = quant_type(defaults.activation.dtype)
    weight_type = quant_type(defaults.weight.dtype)
    model = update_opset_version(model, weight_type, act_type, tensor_quant_overrides=overrides)
    model = with_inferred_shapes(model)
    op_types = sorted({node.op_type for node in model.graph.node if node.name in set(to_quantize)})
    tensors_range = TensorsData(CalibrationMethod.MinMax, data)
    try:
        if fmt == "qoperator":
            quantizer: Any = ONNXQuantizer(
                model,
                defaults.weight.granularity == "per_channel",
                False,
                QuantizationMode.QLinearOps,
                True,
                weight_type,
                act_type,
                tensors_range,
                to_quantize,
                [],
                op_types,
                extra,
            )
        else:
            quantizer = QDQQuantizer(
                model,
                False,
                False,
                weight_type,
                act_type,
                tensors_range,
                to_quantize,
                [],
                op_types,
                extra,
            )
        fast_rewiring(quantizer)
        patch_quantize_onnx_initializer()  # QDQ weights' values: cached, whole-array
        shared = weight_cache.active(quantizer) if weight_cache else contextlib.nullcontext()
        with quiet_quantizer(), vectorized(quantizer), shared, fast_lookups(quantizer):
            quantizer.quantize_model()
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise ModelError(
            f"ONNX Runtime's quantizer rejected the configuration ({type(exc).__name__}: {exc})",
            hint="fall back the ops named above to fp32, or choose other options for them",
        ) from exc
    model_out: onnx.ModelProto = quantizer.model.model
    return model_out
