"""The dynamic pass (DynamicQuantizeLinear + MatMulInteger/ConvInteger), and which static
ops latency-aware quantization may run dynamically instead, with which weights."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lpq import ConfigError, ModelError, OpConfig, TensorConfig, TuneConfig

from .. import model_io
from ..latency import fidelity
from .channelwise import vectorized
from .quantizer import (
    quant_type,
    quiet_quantizer,
    reduce_range,
    shapes_inferred_in_memory,
    tensor_key,
    with_inferred_shapes,
)

if TYPE_CHECKING:
    import onnx


def dynamic_pass(
    model: onnx.ModelProto, ops: Mapping[str, OpConfig], options: Mapping[str, Any]
) -> onnx.ModelProto:
    """``ops`` quantized dynamically, one ORT pass per distinct weight setting."""
    by_setting: dict[tuple[Any, ...], tuple[TensorConfig, list[str]]] = {}
    for name, cfg in ops.items():
        weight = cfg.weight or TensorConfig("int8", "sym", "per_tensor")
        if cfg.activation is not None and cfg.activation.dtype != "uint8":
            raise ConfigError(
                f"op {name}: dynamic quantization quantizes activations to uint8 only",
                hint="set the activation dtype to uint8 or use static quantization",
            )
        by_setting.setdefault(tensor_key(weight), (weight, []))[1].append(name)
    for weight, names in by_setting.values():
        model = _quantize_dynamic(model, weight, names)
    return model


def _quantize_dynamic(
    model: onnx.ModelProto, weight: TensorConfig, names: list[str]
) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import QuantizationMode, update_opset_version

    weight_type = quant_type(weight.dtype)
    model = update_opset_version(model, weight_type)
    if weight.granularity == "per_channel":
        model = model_io.upgrade_opset(model, 13)
    # Shapes inferred in memory, not by ORT through files: on entry (marked, as the static
    # pass does) and after ORT rewrites Gemms as MatMuls (shapes_inferred_in_memory).
    model = with_inferred_shapes(model)
    op_types = sorted({n.op_type for n in model.graph.node if n.name in set(names)})
    extra = {"MatMulConstBOnly": True, "WeightSymmetric": weight.scheme == "sym"}
    try:
        with shapes_inferred_in_memory():
            quantizer = ONNXQuantizer(
                model,
                weight.granularity == "per_channel",
                reduce_range(weight),
                QuantizationMode.IntegerOps,
                False,
                weight_type,
                QuantType.QUInt8,
                None,
                names,
                [],
                op_types,
                extra,
            )
        with quiet_quantizer(), vectorized(quantizer):
            quantizer.quantize_model()
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise ModelError(
            f"ONNX Runtime's dynamic quantizer failed ({type(exc).__name__}: {exc})",
            hint="fall back these ops to fp32: " + ", ".join(names),
        ) from exc
    quantized: onnx.ModelProto = quantizer.model.model
    return quantized


def dynamic_alternatives(
    model: onnx.ModelProto, tune_cfg: TuneConfig, static_ops: Mapping[str, OpConfig]
) -> dict[str, OpConfig]:
    """The static ops latency-aware quantization may run dynamically instead (the capability
    offers them dynamic mode: a constant weight), each with the capability's first dynamic
    config, but with per-tensor weights where they lose little against per-channel ones
    (:data:`lpq_onnxrt.latency.fidelity.PER_TENSOR_WEIGHT_RATIO`: ORT runs those faster)
    unless the ``dynamic_weights`` option says ``per_channel`` (every MatMul per channel) or
    ``per_tensor`` (every MatMul per tensor, as ORT's dynamic quantization). Only MatMuls are
    tried for speed (ORT's ConvInteger has no fast kernel); a conv only where int8 costs
    the model much fidelity (the fidelity step of :func:`lpq.latency.decide`)."""
    from ..capability import build_capability

    wanted = [key for key in tune_cfg.ops if key[0] in static_ops]
    if not wanted:
        return {}
    weights_mode = dynamic_weights(tune_cfg.options)
    capability = build_capability(model, tune_cfg.options)
    weights = {init.name: init for init in model.graph.initializer}
    nodes = {node.name: node for node in model.graph.node}
    found: dict[str, OpConfig] = {}
    for key in wanted:
        if key not in capability.opwise:
            continue
        options = [c for c in capability.op_configs(key) if c.mode == "dynamic"]
        if options:
            found[key[0]] = _weights_choice(options, nodes[key[0]], weights, weights_mode)
    return found


def _weights_choice(
    options: list[OpConfig], node: onnx.NodeProto, weights: Mapping[str, Any], mode: str
) -> OpConfig:
    """The first dynamic config, per tensor instead of per channel where ``mode`` allows
    and (``auto``) the MatMul's weight loses little that way."""
    from onnx import numpy_helper

    choice = options[0]
    per_tensor = (
        replace(choice, weight=replace(choice.weight, granularity="per_tensor"))
        if choice.weight is not None and choice.weight.granularity == "per_channel"
        else None
    )
    if (
        mode != "per_channel"
        and per_tensor in options
        and node.op_type == "MatMul"
        and len(node.input) > 1
        and node.input[1] in weights
    ):
        weight = numpy_helper.to_array(weights[node.input[1]])
        even = fidelity.weight_error_ratio(weight) <= fidelity.PER_TENSOR_WEIGHT_RATIO
        if mode == "per_tensor" or even:
            assert per_tensor is not None
            choice = per_tensor
    return choice


def dynamic_weights(options: Mapping[str, Any]) -> str:
    """The ``dynamic_weights`` option: ``auto`` (default; per tensor where even),
    ``per_channel`` (the capability's first dynamic config for every MatMul) or
    ``per_tensor`` (every MatMul per tensor: fastest, least faithful)."""
    value = str(options.get("dynamic_weights", "auto")).lower()
    if value not in ("auto", "per_channel", "per_tensor"):
        raise ConfigError(
            f"dynamic_weights must be auto, per_channel or per_tensor, not {value!r}",
            hint="auto: per-tensor weights where that loses little; per_channel: every "
            "dynamic MatMul per channel (more faithful); per_tensor: every one per tensor "
            "(fastest)",
        )
    return value
