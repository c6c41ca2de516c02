"""Apply a tune_cfg to an ONNX model, node by node, with ONNX Runtime's quantizers.

This module validates the tune_cfg, sorts its ops by approach and assembles the result;
the passes in :mod:`lpq_onnxrt.passes` do the work, in order, each touching only the
nodes the tune_cfg gives it:

1. **static** (QDQ, or QOperator when ``options['quant_format'] == 'qoperator'``):
   calibrated, with latency-aware decisions, ``auto`` ranges and recipes
   (:mod:`.passes.static_plan`), then ORT's static quantizer (:mod:`.passes.static`).
2. **dynamic** (DynamicQuantizeLinear + MatMulInteger/ConvInteger), one pass per distinct
   weight setting (:mod:`.passes.dynamic`).
3. **weight_only** (MatMulNBits), one pass per (bits, block size, scheme)
   (:mod:`.passes.weight_only`).
4. **float fallbacks** to fp16/bf16 (casts around the node, see :mod:`.lowp`).

Ops set to fp32 are excluded from every pass. The input model is never modified. The
result, and every candidate latency-aware quantization times, carries no inferred inner
shapes (see :func:`.graph.drop_inner_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lpq import ConfigError, OpConfig, TuneConfig

from . import graph, model_io
from .passes.dynamic import dynamic_pass
from .passes.weight_only import weight_only_pass
from .qmodel import QuantizedModel

if TYPE_CHECKING:
    import onnx

    from .passes.static_plan import StaticResult

_FORMATS = ("qdq", "qoperator")

#: One pass per quantization mode that needs no calibration (static is the calibrated
#: pass, with latency-aware decisions); a new mode is one function and one entry.
PASSES: dict[
    str, Callable[[onnx.ModelProto, Mapping[str, OpConfig], Mapping[str, Any]], onnx.ModelProto]
] = {"dynamic": dynamic_pass, "weight_only": weight_only_pass}


def quantize(
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None = None,
) -> QuantizedModel:
    """Calibrate and quantize ``model`` as ``tune_cfg`` says; see the module docstring.
    Post-training only: ORT cannot train, so a ``train_func`` is a ConfigError."""
    if train_func is not None:
        raise ConfigError(
            "the onnxrt adaptor does only post-training quantization",
            hint="quantization-aware training needs a training framework (lpq-torch)",
        )
    prepared = model_io.prepare(model)
    _check_names(prepared.model, tune_cfg)
    groups, floats = _group_ops(tune_cfg)
    fmt = _quant_format(tune_cfg.options)
    static: StaticResult | None = None
    base = prepared.model
    if groups["static"]:
        from .passes.static_plan import quantize_static

        static = quantize_static(prepared, tune_cfg, groups["static"], calib_dataloader, fmt)
        work, base = static.model, static.base
        groups["dynamic"].update(static.dynamic_ops)
    else:
        # The weight-only pass only reads its input and writes a new model: alone, it
        # needs no copy of the float weights (an LLM's prepared model is hundreds of MB).
        # The other passes change their input. (The static pass builds its own model: a
        # copy made before it was held, unused, through calibration and the latency
        # search, 51 MB on ddddocr's recognizer.)
        alone = groups["weight_only"] and not groups["dynamic"]
        work = prepared.model if alone else model_io.copy_model(prepared.model)
    for mode, run_pass in PASSES.items():  # modes that need no calibration
        if mode == "weight_only" and groups[mode]:  # GPTQ/AWQ calibrate when asked to
            work = weight_only_pass(work, groups[mode], tune_cfg.options, calib_dataloader)
        elif groups[mode]:
            work = run_pass(work, groups[mode], tune_cfg.options)
    if floats:
        from .lowp import cast_nodes

        work = cast_nodes(work, floats)
    graph.drop_inner_shapes(work)
    graph.topological_sort(work)
    return _assemble(work, base, tune_cfg, static)


def _check_names(model: onnx.ModelProto, tune_cfg: TuneConfig) -> None:
    nodes = {node.name for node in model.graph.node}
    unknown = [name for name, _ in tune_cfg.ops if name not in nodes]
    if unknown:
        raise ConfigError(
            f"the tune_cfg names node(s) the model does not have: {', '.join(unknown[:5])}",
            hint="build the tune_cfg from this model's capability (lpq names unnamed nodes "
            "<OpType>_<index>)",
        )


def _group_ops(tune_cfg: TuneConfig) -> tuple[dict[str, dict[str, OpConfig]], dict[str, str]]:
    """The quantized ops by mode (static first, then :data:`PASSES`' order), and the ops
    kept in a low-precision float (name -> fp16 / bf16)."""
    groups: dict[str, dict[str, OpConfig]] = {"static": {}, **{mode: {} for mode in PASSES}}
    floats: dict[str, str] = {}
    for (name, _), cfg in tune_cfg.ops.items():
        if not cfg.quantized:
            if cfg.precision != "fp32":
                floats[name] = cfg.precision
            continue
        if cfg.mode not in groups:
            raise ConfigError(
                f"op {name}: unknown quantization mode {cfg.mode!r}",
                hint="use static, dynamic or weight_only",
            )
        groups[cfg.mode][name] = cfg
    return groups, floats


def _quant_format(options: Mapping[str, Any]) -> str:
    """``quant_format``: qdq, qoperator or auto (``default`` is auto)."""
    fmt = str(options.get("quant_format", "auto")).lower()
    if fmt == "default":
        fmt = "auto"
    if fmt not in (*_FORMATS, "auto"):
        raise ConfigError(f"unknown quant_format {fmt!r}", hint="use qdq or qoperator")
    return fmt


def _assemble(
    work: onnx.ModelProto,
    base: onnx.ModelProto,
    tune_cfg: TuneConfig,
    static: StaticResult | None,
) -> QuantizedModel:
    decision = static.decision if static is not None else None
    chosen = static.range_choice if static is not None else None
    options = dict(tune_cfg.options)
    if decision is not None:
        options["quant_format"] = decision.quant_format
    return QuantizedModel(
        work,
        static.tune_cfg if static is not None else tune_cfg,
        static.ranges if static is not None else {},
        options,
        fp32_outputs=graph.node_outputs(base),
        fp32_weights=graph.node_weights(base),
        latency=decision.to_json() if decision is not None else None,
        range_choice=chosen.to_json() if chosen is not None else None,
    )
