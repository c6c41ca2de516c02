"""Apply a tune_cfg to an ONNX model, node by node, with ONNX Runtime's quantizers.

Passes, in order, each touching only the nodes the tune_cfg gives it:

1. **static** (QDQ, or QOperator when ``options['quant_format'] == 'qoperator'``): ranges
   come from lpq's streaming calibration (per tensor, with the algorithm and scheme of the
   op that owns the tensor); per-op activation/weight dtype, scheme and per-channel axis
   are passed to ORT as ``TensorQuantOverrides``. Data-movement ops between quantized
   ops (Relu, MaxPool, Reshape, ...) follow their input, as ORT's own tool does.
2. **dynamic** (DynamicQuantizeLinear + MatMulInteger/ConvInteger), one pass per distinct
   weight setting.
3. **weight_only** (MatMulNBits), one pass per (bits, block size, scheme).
4. **float fallbacks** to fp16/bf16 (casts around the node, see :mod:`.lowp`).

Ops set to fp32 are excluded from every pass. The input model is never modified. The
result, and every candidate latency-aware quantization times, carries no inferred inner
shapes (see :func:`.graph.drop_inner_shapes`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, DataError, ModelError, OpConfig, TensorConfig, TuneConfig

from . import graph, latency, model_io, range_choice, ranges, recipes, streams
from .qmodel import QuantizedModel

if TYPE_CHECKING:
    import onnx

    from .calibration import CalibrationStats

log = logging.getLogger(__name__)

_WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1, "Gather": 0}
_DTYPES_8BIT = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}
_FORMATS = ("qdq", "qoperator")


def _quant_type(dtype: str) -> Any:
    from onnxruntime.quantization import QuantType

    if dtype not in _DTYPES_8BIT:
        raise ConfigError(
            f"ONNX Runtime cannot quantize tensors to {dtype!r} in this mode",
            hint=f"choose one of: {', '.join(_DTYPES_8BIT)}",
        )
    return getattr(QuantType, _DTYPES_8BIT[dtype])


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
    base = prepared.model
    model_key = prepared.key
    nodes = {node.name: node for node in base.graph.node}
    unknown = [name for name, _ in tune_cfg.ops if name not in nodes]
    if unknown:
        raise ConfigError(
            f"the tune_cfg names node(s) the model does not have: {', '.join(unknown[:5])}",
            hint="build the tune_cfg from this model's capability (lpq names unnamed nodes "
            "<OpType>_<index>)",
        )
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

    fmt = str(tune_cfg.options.get("quant_format", "auto")).lower()
    if fmt == "default":
        fmt = "auto"
    if fmt not in (*_FORMATS, "auto"):
        raise ConfigError(f"unknown quant_format {fmt!r}", hint="use qdq or qoperator")

    work = model_io.copy_model(base)
    used_ranges: dict[str, tuple[float, float]] = {}
    effective = tune_cfg
    decision: latency.LatencyDecision | None = None
    ranges_chosen: range_choice.RangeChoice | None = None
    if groups["static"]:
        if calib_dataloader is None:
            raise DataError(
                "static quantization needs calibration data, but none was given",
                hint="pass calibration data, or use dynamic / weight-only quantization",
            )
        from .calibration import memory_budget
        from .capability import load_spec
        from .fallback import read_float_inputs

        op_types = load_spec().quantizable_op_types()

        def calibrate(model: onnx.ModelProto, key: str) -> CalibrationStats:
            return ranges.statistics(
                model,
                key,
                ranges.calibration_candidates(model, op_types),
                calib_dataloader,
                tune_cfg.calib_sampling_size,
                memory_budget_bytes=memory_budget(tune_cfg.options),
            )

        stats = calibrate(base, model_key)
        float_ops = [name for (name, _), cfg in tune_cfg.ops.items() if not cfg.quantized]

        dynamic_configs = _dynamic_alternatives(prepared.model, tune_cfg, groups["static"])

        def build_plan(
            plan: Mapping[str, OpConfig],
            fp32_ops: frozenset[str],
            form: str,
            dynamic_ops: frozenset[str] = frozenset(),
            range_scales: Mapping[str, float] | None = None,
        ) -> onnx.ModelProto:
            static = {n: c for n, c in plan.items() if n not in fp32_ops and n not in dynamic_ops}
            built = model_io.copy_model(base)
            if static:
                built, _ = _static_pass(built, static, tune_cfg, stats, form, range_scales)
            built = read_float_inputs(built, base, [*float_ops, *fp32_ops, *dynamic_ops])
            if dynamic_ops:
                dyn = {n: dynamic_configs[n] for n in dynamic_ops}
                built = _dynamic_pass(built, dyn, tune_cfg.options)
            return graph.drop_inner_shapes(built)  # timed as it will ship

        def build(
            fp32_ops: frozenset[str], form: str, dynamic_ops: frozenset[str] = frozenset()
        ) -> onnx.ModelProto:
            return build_plan(groups["static"], fp32_ops, form, dynamic_ops)

        # The calibration feeds are read and their streams found once; one output-error
        # function on all of them (its fp32 reference outputs computed once), and, for
        # narrowing, one on each half.
        error_feeds = functools.cache(
            lambda: _error_feeds(prepared.model, tune_cfg, calib_dataloader)
        )

        def error_on(part: tuple[int, int]) -> Callable[[onnx.ModelProto], float]:
            feeds, found = error_feeds()
            return latency.output_error(tune_cfg.options, feeds, prepared.model, found, part)

        output_error = functools.cache(lambda: error_on((0, 1)))
        auto = set(range_choice.auto_ops(groups["static"]))
        final_plan = groups["static"]
        fp32_decided: frozenset[str] = frozenset()
        dynamic_decided: frozenset[str] = frozenset()
        if latency.enabled(tune_cfg.options):
            # Decided on the plain model (the recipes change values, not the graph's
            # shape), with minmax ranges: the requested ones (``auto``: chosen below) go
            # on the graph the decisions leave.
            groups["static"] = range_choice.for_decisions(final_plan)
            decision = _latency_decision(
                prepared,
                tune_cfg,
                groups["static"],
                calib_dataloader,
                fmt,
                build,
                list(dynamic_configs),
                output_error(),
            )
            fmt = decision.quant_format
            fp32_decided = frozenset(decision.fp32_ops)
            dynamic_decided = frozenset(decision.dynamic_ops)
            changed: dict[tuple[str, str], OpConfig] = {
                key: OpConfig.fallback() for key in tune_cfg.ops if key[0] in fp32_decided
            }
            for key in tune_cfg.ops:
                if key[0] in dynamic_decided:
                    changed[key] = groups["dynamic"][key[0]] = dynamic_configs[key[0]]
            effective = effective.with_ops(changed)
            decided = fp32_decided | dynamic_decided
            final_plan = {name: cfg for name, cfg in final_plan.items() if name not in decided}
        if fmt == "auto":
            fmt = "qdq"
        resolving = auto & set(final_plan)
        if resolving:
            # Chosen on the graph that ships (format, fp32 and dynamic ops decided): on
            # Silero VAD the best algorithm for the QDQ graph is the worst for QOperator.
            narrowing = None
            if len(final_plan) <= range_choice.NARROW_MAX_OPS:
                outputs = {output.name for output in base.graph.output}
                available = set(stats.tensor_names())
                narrowing = range_choice.Narrowing(
                    [
                        name
                        for name in ranges.activation_tensors(base, resolving)
                        if name in available and name not in outputs
                    ],
                    [error_on((k, 2)) for k in range(2)],
                )
            final_plan, ranges_chosen = range_choice.resolve(
                final_plan,
                lambda plan, scales: build_plan(
                    plan, fp32_decided, fmt, dynamic_decided, range_scales=scales
                ),
                output_error(),
                narrowing,
            )
            effective = effective.with_ops(
                {key: final_plan[key[0]] for key in tune_cfg.ops if key[0] in resolving}
            )
            if ranges_chosen is not None and ranges_chosen.narrowed:
                recorded = range_choice.scales_from(tune_cfg.options)
                effective = effective.with_options(
                    {range_choice.SCALES_OPTION: {**recorded, **ranges_chosen.narrowed}}
                )
        groups["static"] = dict(final_plan)
        chosen = recipes.requested(tune_cfg.options)
        if chosen and groups["static"]:  # only for the ops that stay int8
            base = recipes.apply(
                base,
                tune_cfg.options,
                lambda: ranges.limited_feeds(
                    prepared.model, calib_dataloader, tune_cfg.calib_sampling_size
                ),
                groups["static"],
            )
            model_key = f"{prepared.key}|{json.dumps(chosen, sort_keys=True, default=str)}"
            work = model_io.copy_model(base)
            stats = calibrate(base, model_key)
        if groups["static"]:
            work, used_ranges = _static_pass(
                work,
                groups["static"],
                tune_cfg,
                stats,
                fmt,
                range_choice.scales_from(effective.options),
            )
        # Ops kept float, and dynamic ops (they quantize their float input themselves; a
        # DequantizeLinear in front would be quantized twice, under the same name).
        fp32_now = [
            name
            for (name, _), cfg in effective.ops.items()
            if not cfg.quantized or cfg.mode == "dynamic"
        ]
        work = read_float_inputs(work, base, fp32_now)
    for mode, run_pass in PASSES.items():  # modes that need no calibration
        if groups[mode]:
            work = run_pass(work, groups[mode], tune_cfg.options)
    if floats:
        from .lowp import cast_nodes

        work = cast_nodes(work, floats)
    graph.drop_inner_shapes(work)
    graph.topological_sort(work)
    options = dict(tune_cfg.options)
    if decision is not None:
        options["quant_format"] = decision.quant_format
    return QuantizedModel(
        work,
        effective,
        used_ranges,
        options,
        fp32_outputs=graph.node_outputs(base),
        fp32_weights=graph.node_weights(base),
        latency=decision.to_json() if decision is not None else None,
        range_choice=ranges_chosen.to_json() if ranges_chosen is not None else None,
    )


def _dynamic_alternatives(
    model: onnx.ModelProto, tune_cfg: TuneConfig, static_ops: Mapping[str, OpConfig]
) -> dict[str, OpConfig]:
    """The static ops latency-aware quantization may run dynamically instead (the capability
    offers them dynamic mode: a constant weight), each with the capability's first dynamic
    config, but with per-tensor weights where they lose little against per-channel ones
    (:data:`latency.PER_TENSOR_WEIGHT_RATIO`: ORT runs those faster) unless the
    ``dynamic_weights`` option says ``per_channel`` (every MatMul per channel) or
    ``per_tensor`` (every MatMul per tensor, as ORT's dynamic quantization). Only MatMuls are
    tried for speed (ORT's ConvInteger has no fast kernel); a conv only where int8 costs
    the model much fidelity (see :func:`latency.decide`)."""
    from onnx import numpy_helper

    from .capability import build_capability

    wanted = [key for key in tune_cfg.ops if key[0] in static_ops]
    if not wanted:
        return {}
    weights_mode = _dynamic_weights(tune_cfg.options)
    capability = build_capability(model, tune_cfg.options)
    weights = {init.name: init for init in model.graph.initializer}
    nodes = {node.name: node for node in model.graph.node}
    found: dict[str, OpConfig] = {}
    for key in wanted:
        if key not in capability.opwise:
            continue
        options = [c for c in capability.op_configs(key) if c.mode == "dynamic"]
        if not options:
            continue
        choice = options[0]
        per_tensor = (
            replace(choice, weight=replace(choice.weight, granularity="per_tensor"))
            if choice.weight is not None and choice.weight.granularity == "per_channel"
            else None
        )
        node = nodes[key[0]]
        if (
            weights_mode != "per_channel"
            and per_tensor in options
            and node.op_type == "MatMul"
            and len(node.input) > 1
            and node.input[1] in weights
        ):
            weight = numpy_helper.to_array(weights[node.input[1]])
            even = latency.weight_error_ratio(weight) <= latency.PER_TENSOR_WEIGHT_RATIO
            if weights_mode == "per_tensor" or even:
                choice = per_tensor
        found[key[0]] = choice
    return found


def _dynamic_weights(options: Mapping[str, Any]) -> str:
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


def _latency_batch_size(options: Mapping[str, Any]) -> int | None:
    """``latency_batch_size`` (or env ``LPQ_LATENCY_BATCH_SIZE``): the batch to time at."""
    import os

    value = options.get("latency_batch_size") or os.environ.get("LPQ_LATENCY_BATCH_SIZE")
    if value in (None, "", 0, "0"):
        return None
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise ConfigError(
            f"latency_batch_size must be a whole number >= 1, not {value!r}",
            hint="set it to the batch size the model is deployed at (e.g. 8)",
        )
    return size


def _error_feeds(
    model: onnx.ModelProto, tune_cfg: TuneConfig, calib_dataloader: Iterable[Any]
) -> tuple[list[dict[str, np.ndarray]], streams.Streams | None]:
    """The calibration feeds output errors are measured on: a spread of batches, or, when
    the calibration data was recorded from streams, all of it and its streams (see
    :mod:`streams`)."""
    from .session import create_session

    feeds = list(ranges.limited_feeds(model, calib_dataloader, tune_cfg.calib_sampling_size))
    session = create_session(model, latency.measuring_options(tune_cfg.options))
    found = streams.find(lambda feed: session.run(None, dict(feed)), feeds)
    if found is None:
        return latency.spread(feeds, latency.ERROR_BATCHES), None
    log.info(
        "calibration data is %d stream(s), state %s: output error measured on streams",
        len(found.chains),
        ", ".join(found.links),
    )
    return feeds, found


def _latency_decision(
    prepared: model_io.PreparedModel,
    tune_cfg: TuneConfig,
    static_ops: Mapping[str, OpConfig],
    calib_dataloader: Iterable[Any],
    fmt: str,
    build: latency.Builder,
    dynamic: list[str],
    error: Callable[[onnx.ModelProto], float],
) -> latency.LatencyDecision:
    """Measure (or read from the cache) which static ops int8 makes slower here, and which
    run faster (or as fast, more faithfully) dynamically quantized."""
    from .data import batched_feed, input_specs

    options = tune_cfg.options
    feeds = ranges.limited_feeds(prepared.model, calib_dataloader, tune_cfg.calib_sampling_size)
    batch = _latency_batch_size(options)
    # At the batch the user deploys: calibration samples stacked (cycled); else the first.
    feed = next(feeds) if batch is None else batched_feed(input_specs(prepared.model), feeds, batch)
    plan = {name: cfg.to_json() for name, cfg in sorted(static_ops.items())}
    context = latency.cache_context(prepared.key, feed, options)
    key = latency.cache_key(context, plan)
    folder = latency.cache_dir(options)
    cached = latency.load_cached(folder, key) or latency.derived(folder, context, plan)
    if cached is not None:
        log.info("latency decisions from the cache (%d ops kept fp32)", len(cached.fp32_ops))
        return cached
    ops = [(name, op_type) for (name, op_type) in tune_cfg.ops if name in static_ops]
    formats = ("qdq", "qoperator") if fmt == "auto" else (fmt,)
    timer = latency.ort_timer(options, budget_s=float(options.get("latency_budget_s", 1.0)))
    # The fp32 side of every comparison, shaped as the candidates are (see build_plan).
    fp32 = graph.drop_inner_shapes(model_io.copy_model(prepared.model))
    blame = latency.profile_blame(options, feed, fp32, [n for n, _ in ops])
    decision = latency.decide(
        build,
        fp32,
        ops,
        feed,
        formats=formats,
        timer=timer,
        margin=float(options.get("latency_margin", latency.DEFAULT_MARGIN)),
        blame=blame,
        dynamic=dynamic,
        error=error,
    )
    latency.store(folder, key, decision, context, plan)
    return decision


# --------------------------------------------------------------------------- static


def _static_pass(
    model: onnx.ModelProto,
    ops: Mapping[str, OpConfig],
    tune_cfg: TuneConfig,
    stats: CalibrationStats,
    fmt: str,
    range_scales: Mapping[str, float] | None = None,
) -> tuple[onnx.ModelProto, dict[str, tuple[float, float]]]:
    from onnxruntime.quantization import QDQQuantizer
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import QuantizationMode, update_opset_version

    if any(_per_channel(cfg) for cfg in ops.values()):
        model = model_io.upgrade_opset(model, 13)  # DequantizeLinear's axis needs opset 13
    graph.flatten_gemm_biases(model)
    configured = {name for name, _ in tune_cfg.ops}
    helpers = [
        node.name
        for node in model.graph.node
        if node.op_type in ranges.FOLLOW_OPS and node.name not in configured
    ]
    to_quantize = [*ops, *helpers]
    default_act = _most_common(
        [cfg.activation for cfg in ops.values() if cfg.activation is not None],
        TensorConfig("uint8", "asym"),
    )
    default_weight = _most_common(
        [cfg.weight for cfg in ops.values() if cfg.weight is not None],
        TensorConfig("int8", "sym", "per_channel"),
    )

    # Which op's activation settings decide each tensor: its first quantized consumer,
    # else its quantized producer, else the most common setting.
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

    available = set(stats.tensor_names())
    tensors = [t for t in ranges.activation_tensors(model, to_quantize) if t in available]
    # A model output keeps every value it took in calibration: a clipping algorithm trades
    # rare values for resolution, and at the output the rare values are the answer.
    # PP-OCRv4 det's probability map, mostly background near 0, got kl range [0, 0.125]:
    # no pixel reached the 0.3 text threshold, IoU 0 (minmax: 0.91).
    outputs = {output.name for output in model.graph.output}
    # Narrowed by ``auto`` on the output error (range_choice.narrow), or as recorded.
    scales = range_choice.scales_from(tune_cfg.options)
    if range_scales is not None:
        scales.update(range_scales)
    overrides: dict[str, list[dict[str, Any]]] = {}
    data: dict[str, TensorData] = {}
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
        if _key(act) != _key(default_act):
            overrides[name] = [{"quant_type": _quant_type(act.dtype), "symmetric": symmetric}]

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
            "quant_type": _quant_type(cfg.weight.dtype),
            "symmetric": cfg.weight.scheme == "sym",
        }
        if _per_channel(cfg) and len(initializers[weight_name].dims) >= 2:
            entry["axis"] = graph.weight_axis(node)
        if _reduce_range(cfg.weight):
            entry["reduce_range"] = True  # 7-bit weights, for CPUs without VNNI
        overrides[weight_name] = [entry]

    extra: dict[str, Any] = {
        "TensorQuantOverrides": overrides,
        "ActivationSymmetric": default_act.scheme == "sym",
        "WeightSymmetric": default_weight.scheme == "sym",
    }
    act_type = _quant_type(default_act.dtype)
    weight_type = _quant_type(default_weight.dtype)
    model = update_opset_version(model, weight_type, act_type, tensor_quant_overrides=overrides)
    op_types = sorted({node.op_type for node in model.graph.node if node.name in set(to_quantize)})
    tensors_range = TensorsData(CalibrationMethod.MinMax, data)
    try:
        if fmt == "qoperator":
            quantizer: Any = ONNXQuantizer(
                model,
                default_weight.granularity == "per_channel",
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
        with _quiet_quantizer():
            quantizer.quantize_model()
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise ModelError(
            f"ONNX Runtime's quantizer rejected the configuration ({type(exc).__name__}: {exc})",
            hint="fall back the ops named above to fp32, or choose other options for them",
        ) from exc
    return quantizer.model.model, used


def _key(tensor: TensorConfig) -> tuple[Any, ...]:
    """A hashable identity for a TensorConfig (its ``options`` is a dict)."""
    return (
        tensor.dtype,
        tensor.scheme,
        tensor.granularity,
        tensor.algorithm,
        tuple(sorted(tensor.options.items())),
    )


def _most_common(tensors: list[TensorConfig], default: TensorConfig) -> TensorConfig:
    if not tensors:
        return default
    counts = Counter(_key(t) for t in tensors)
    best = counts.most_common(1)[0][0]
    return next(t for t in tensors if _key(t) == best)


def _per_channel(cfg: OpConfig) -> bool:
    return cfg.weight is not None and cfg.weight.granularity == "per_channel"


def _reduce_range(tensor: TensorConfig | None) -> bool:
    """The capability's ``reduce_range`` knob: ORT's 7-bit weights ([-64, 64] signed,
    [0, 127] unsigned)."""
    return tensor is not None and tensor.reduce_range


# --------------------------------------------------------------------------- dynamic


class _QuantizerNoise(logging.Filter):
    """Moves ORT quantizer warnings that are expected under lpq to lpq's debug log."""

    EXPECTED = (
        # the dynamic pass runs on a model the static pass already gave Q/DQ nodes
        "already quantized",
        # ORT checks the int64 shape tensors around ops it quantizes (122 lines in one
        # default quantization of Silero VAD); what was quantized is read from the model
        "unsupported type to quantize",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(text in message for text in self.EXPECTED):
            log.debug("ORT quantizer: %s", message.splitlines()[0])
            return False
        return True


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ORT's quantizers warn on the root logger about things lpq expects (see
    :class:`_QuantizerNoise`): noise to a user, so they go to lpq's debug log."""
    root = logging.getLogger()
    quiet = _QuantizerNoise()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def _dynamic_pass(
    model: onnx.ModelProto, ops: Mapping[str, OpConfig], options: Mapping[str, Any]
) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import QuantizationMode, update_opset_version

    by_setting: dict[tuple[Any, ...], tuple[TensorConfig, list[str]]] = {}
    for name, cfg in ops.items():
        weight = cfg.weight or TensorConfig("int8", "sym", "per_tensor")
        if cfg.activation is not None and cfg.activation.dtype != "uint8":
            raise ConfigError(
                f"op {name}: dynamic quantization quantizes activations to uint8 only",
                hint="set the activation dtype to uint8 or use static quantization",
            )
        by_setting.setdefault(_key(weight), (weight, []))[1].append(name)
    for weight, names in by_setting.values():
        weight_type = _quant_type(weight.dtype)
        model = update_opset_version(model, weight_type)
        if weight.granularity == "per_channel":
            model = model_io.upgrade_opset(model, 13)
        op_types = sorted({n.op_type for n in model.graph.node if n.name in set(names)})
        extra = {"MatMulConstBOnly": True, "WeightSymmetric": weight.scheme == "sym"}
        try:
            quantizer = ONNXQuantizer(
                model,
                weight.granularity == "per_channel",
                _reduce_range(weight),
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
            with _quiet_quantizer():
                quantizer.quantize_model()
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise ModelError(
                f"ONNX Runtime's dynamic quantizer failed ({type(exc).__name__}: {exc})",
                hint="fall back these ops to fp32: " + ", ".join(names),
            ) from exc
        model = quantizer.model.model
    return model


# --------------------------------------------------------------------------- weight-only


def _weight_only_pass(
    model: onnx.ModelProto, ops: Mapping[str, OpConfig], options: Mapping[str, Any]
) -> onnx.ModelProto:
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:  # onnx-ir missing, or a very old ORT
        raise ModelError(
            f"ONNX Runtime's 4-bit quantizer is unavailable ({exc})",
            hint="pip install onnx-ir (and onnxruntime>=1.18)",
        ) from exc

    groups: dict[tuple[int, int, bool], list[str]] = {}
    for name, cfg in ops.items():
        weight = cfg.weight
        if weight is None or weight.dtype not in ("int4", "uint4"):
            raise ConfigError(
                f"op {name}: weight-only quantization needs an int4 or uint4 weight config",
                hint="use the weight_only options the capability lists for MatMul",
            )
        block = int(weight.options.get("block_size", 32))
        bits = int(weight.options.get("bits", 4))
        groups.setdefault((bits, block, weight.scheme == "sym"), []).append(name)
    matmuls = [node.name for node in model.graph.node if node.op_type == "MatMul"]
    for (bits, block, symmetric), names in groups.items():
        keep = [name for name in matmuls if name not in set(names)]
        try:
            quantizer = MatMulNBitsQuantizer(
                model,
                bits=bits,
                block_size=block,
                is_symmetric=symmetric,
                accuracy_level=options.get("accuracy_level"),
                nodes_to_exclude=keep,
                op_types_to_quantize=("MatMul",),
            )
            quantizer.process()
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime's {bits}-bit weight quantizer failed ({type(exc).__name__}: {exc})",
                hint="fall back these ops to fp32: " + ", ".join(names),
            ) from exc
        model = quantizer.model.model
    return model


#: One pass per quantization mode that needs no calibration (static is the calibrated
#: pass above, with latency-aware decisions); a new mode is one function and one entry.
PASSES: dict[
    str, Callable[[onnx.ModelProto, Mapping[str, OpConfig], Mapping[str, Any]], onnx.ModelProto]
] = {"dynamic": _dynamic_pass, "weight_only": _weight_only_pass}
