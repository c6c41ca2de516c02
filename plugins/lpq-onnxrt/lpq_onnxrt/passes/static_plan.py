"""Settling the static plan, then running the static pass.

The static ops of a tune_cfg go through, in order: calibration (lpq's streaming
statistics); Concats whose inputs cannot share one int8 scale kept fp32
(:mod:`lpq_onnxrt.shared_scale`); with ``latency_aware``, the measured decisions
(format, ops kept fp32, ops run dynamically instead, see :mod:`lpq_onnxrt.latency`); the
``auto`` activation range algorithms resolved on the graph that ships
(:mod:`lpq_onnxrt.range_choice`); the accuracy recipes (:mod:`lpq_onnxrt.recipes`, then
calibrated again); and finally :func:`.static.static_pass`. Every candidate built on the
way is shaped as it will ship (inner shapes dropped, see
:func:`lpq_onnxrt.graph.drop_inner_shapes`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lpq import DataError, ModelError, OpConfig, TuneConfig
from lpq.ranges import keep_float, record, resolve

from .. import graph, model_io, range_choice, ranges, recipes, shared_scale
from ..latency import aware, fidelity
from ..latency.backend import Builder, LatencyDecision
from .dynamic import dynamic_alternatives
from .quantizer import WeightCache, per_channel
from .static import static_pass

if TYPE_CHECKING:
    import onnx

    from ..calibration import CalibrationStats

log = logging.getLogger(__name__)


@dataclass
class StaticResult:
    """What the static ops became, for :func:`lpq_onnxrt.quantize.quantize` to finish."""

    model: onnx.ModelProto
    #: the fp32 model the static ops were quantized from (recipes applied, if any)
    base: onnx.ModelProto
    #: the tune_cfg as applied: decided fallbacks and dynamic ops, resolved algorithms
    tune_cfg: TuneConfig
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: static ops latency-aware quantization moved to the dynamic pass, with their configs
    dynamic_ops: dict[str, OpConfig] = field(default_factory=dict)
    decision: LatencyDecision | None = None
    range_choice: range_choice.RangeChoice | None = None


class _Candidates:
    """Builds the candidate models of one static plan (the decisions and the range choice
    compare them) from one calibration, and measures their output error."""

    def __init__(
        self,
        prepared: model_io.PreparedModel,
        tune_cfg: TuneConfig,
        calib_dataloader: Iterable[Any],
        static_ops: Mapping[str, OpConfig],
    ) -> None:
        from ..capability import load_spec

        self.prepared = prepared
        self.tune_cfg = tune_cfg
        self.calib_dataloader = calib_dataloader
        self.op_types = load_spec().quantizable_op_types()
        self.stats = self.calibrate(prepared.model, prepared.key)
        self.float_ops = [name for (name, _), cfg in tune_cfg.ops.items() if not cfg.quantized]
        self.dynamic_configs = dynamic_alternatives(prepared.model, tune_cfg, static_ops)
        # The calibration feeds are read and their streams found once; one output-error
        # function on all of them (its fp32 reference outputs computed once), and, for
        # narrowing, one on each half.
        self._error_feeds = functools.cache(
            lambda: fidelity.error_feeds(prepared.model, tune_cfg, calib_dataloader)
        )
        self.output_error = functools.cache(lambda: self.error_on((0, 1)))
        # Per-channel QDQ needs opset 13: the static pass converts a model below it. Done
        # once here, not in every candidate (ddddocr rec, opset 11: 0.5 s per build).
        self._opset_13 = functools.cache(lambda: model_io.upgrade_opset(prepared.model, 13))
        # Every candidate quantizes the same weights: once, for all of them.
        self.weight_cache = WeightCache()

    def static_source(self, static_ops: Mapping[str, OpConfig]) -> onnx.ModelProto:
        """The model the static pass starts from for ``static_ops`` (read-only): the
        prepared one, at opset 13 when an op has per-channel weights (as the pass would
        convert it)."""
        if any(per_channel(cfg) for cfg in static_ops.values()):
            return self._opset_13()
        return self.prepared.model

    def calibrate(self, model: onnx.ModelProto, key: str) -> CalibrationStats:
        from ..calibration import memory_budget

        return ranges.statistics(
            model,
            key,
            ranges.calibration_candidates(model, self.op_types),
            self.calib_dataloader,
            self.tune_cfg.calib_sampling_size,
            memory_budget_bytes=memory_budget(self.tune_cfg.options),
        )

    def build(
        self,
        plan: Mapping[str, OpConfig],
        fp32_ops: frozenset[str],
        form: str,
        dynamic_ops: frozenset[str] = frozenset(),
        range_scales: Mapping[str, float] | None = None,
    ) -> onnx.ModelProto:
        """``plan`` in format ``form``, but ``fp32_ops`` in fp32 and ``dynamic_ops``
        quantized dynamically."""
        from ..fallback import read_float_inputs
        from .dynamic import dynamic_pass

        base = self.prepared.model
        static = {n: c for n, c in plan.items() if n not in fp32_ops and n not in dynamic_ops}
        built = model_io.copy_model(self.static_source(static))
        if static:
            built, _ = static_pass(
                built, static, self.tune_cfg, self.stats, form, range_scales, self.weight_cache
            )
        built = read_float_inputs(built, base, [*self.float_ops, *fp32_ops, *dynamic_ops])
        if dynamic_ops:
            dyn = {n: self.dynamic_configs[n] for n in dynamic_ops}
            built = dynamic_pass(built, dyn, self.tune_cfg.options)
        return graph.drop_inner_shapes(built)  # timed as it will ship

    def builder(self, plan: Mapping[str, OpConfig]) -> Builder:
        def build(
            fp32_ops: frozenset[str], form: str, dynamic_ops: frozenset[str] = frozenset()
        ) -> onnx.ModelProto:
            return self.build(plan, fp32_ops, form, dynamic_ops)

        return build

    def error_on(self, part: tuple[int, int]) -> Callable[[onnx.ModelProto], float]:
        feeds, found, batched = self._error_feeds()
        return fidelity.output_error(
            self.tune_cfg.options, feeds, self.prepared.model, found, part, batched
        )


def quantize_static(
    prepared: model_io.PreparedModel,
    tune_cfg: TuneConfig,
    static_ops: Mapping[str, OpConfig],
    calib_dataloader: Iterable[Any] | None,
    fmt: str,
) -> StaticResult:
    """Calibrate, settle and quantize ``static_ops`` of ``prepared`` (see the module
    docstring); ``fmt`` is "qdq", "qoperator" or "auto" (measured, else QDQ)."""
    if calib_dataloader is None:
        raise DataError(
            "static quantization needs calibration data, but none was given",
            hint="pass calibration data, or use dynamic / weight-only quantization",
        )
    already = model_io.quantized_nodes(prepared.model)
    if already:  # said before calibration and latency measurement start
        static_ops, tune_cfg = _float_part(prepared, tune_cfg, static_ops, already)
    log.info("calibrating %d op(s) on %s", len(static_ops), _samples(tune_cfg))
    candidates = _Candidates(prepared, tune_cfg, calib_dataloader, static_ops)
    result = StaticResult(prepared.model, prepared.model, tune_cfg)
    plan = _keep_unshareable_float(candidates, dict(static_ops), result)
    auto = set(range_choice.auto_ops(plan))
    fp32_ops: frozenset[str] = frozenset()
    if aware.enabled(tune_cfg.options):
        plan = _decide_latency(candidates, plan, fmt, result)
        assert result.decision is not None
        fmt = result.decision.quant_format
        fp32_ops = frozenset(result.decision.fp32_ops)
    if fmt == "auto":
        fmt = "qdq"
    resolving = auto & set(plan)
    if resolving:
        plan = _resolve_ranges(candidates, plan, resolving, fmt, fp32_ops, result)
    _apply(candidates, plan, fmt, result)
    if already:
        _check_built(result.model, prepared.source, already)
    return result


def _samples(tune_cfg: TuneConfig) -> str:
    size = tune_cfg.calib_sampling_size
    return f"up to {size} samples" if size else "the calibration data"


def _float_part(
    prepared: model_io.PreparedModel,
    tune_cfg: TuneConfig,
    static_ops: Mapping[str, OpConfig],
    already: dict[str, int],
) -> tuple[dict[str, OpConfig], TuneConfig]:
    """An input that is already quantized: its float ops away from the quantized part
    (those ORT's quantizer can add Q/DQ nodes to without clashing with the existing
    ones), with the others fp32 in the returned tune_cfg; a ModelError when none is left.

    ORT's quantizers name the nodes and tensors they add after the tensors they quantize
    (``<tensor>_QuantizeLinear``, ``<tensor>_quantized``); quantizing a tensor the model
    already quantizes builds a graph with two nodes of one name, which ORT refuses to
    load ("two nodes with same node name (140_QuantizeLinear)")."""
    what = f"{prepared.source} is already quantized ({model_io.describe_quantized(already)})"
    touched = model_io.quantized_tensors(prepared.model)
    nodes = {node.name: node for node in prepared.model.graph.node}
    blocked = {
        name
        for name in static_ops
        if name not in nodes or touched & {*nodes[name].input, *nodes[name].output}
    }
    if len(blocked) == len(static_ops):
        raise ModelError(
            f"{what}: every op left to quantize reads or writes a tensor its quantized part "
            "already quantizes, and ONNX Runtime's quantizer cannot quantize a tensor twice "
            "(it would build an invalid graph); nothing to do",
            hint="quantize the float model it was made from (lpq quantizes float models), "
            "or use this one as it is",
        )
    if blocked:
        log.warning(
            "%s: quantizing only its %d float op(s) away from the quantized part; %d op(s) "
            "next to it stay as they are (%s)",
            what,
            len(static_ops) - len(blocked),
            len(blocked),
            ", ".join(sorted(blocked)[:5]) + (", ..." if len(blocked) > 5 else ""),
        )
    else:
        log.warning("%s: quantizing its %d float op(s) beside it", what, len(static_ops))
    kept = {name: cfg for name, cfg in static_ops.items() if name not in blocked}
    return kept, tune_cfg.with_fallbacks(blocked)


def _check_built(model: onnx.ModelProto, source: str, already: dict[str, int]) -> None:
    """The model built from an already-quantized input is a valid graph: every node name
    once, every tensor written once (else a ModelError saying why, not ORT's load error
    later)."""
    names: set[str] = set()
    written: set[str] = set()
    for node in model.graph.node:
        clash = [out for out in node.output if out and out in written]
        if (node.name and node.name in names) or clash:
            raise ModelError(
                f"{source} is already quantized ({model_io.describe_quantized(already)}), and "
                f"quantizing its float ops beside that clashed with it (node {node.name!r}): "
                "nothing written",
                hint="quantize the float model it was made from",
            )
        names.add(node.name)
        written.update(node.output)


def _keep_unshareable_float(
    candidates: _Candidates, plan: dict[str, OpConfig], result: StaticResult
) -> dict[str, OpConfig]:
    """The ops of ``plan`` whose inputs' calibrated ranges cannot share one int8 scale
    (:mod:`lpq.ranges.shared_scale`) kept fp32: said, and recorded as fallbacks in
    ``result``'s tune_cfg. Returns the rest of the plan. Decided from the ranges alone,
    before anything is built or timed."""
    found = shared_scale.unshareable_ops(
        candidates.prepared.model, candidates.stats, plan, candidates.tune_cfg.options
    )
    if not found:
        return plan
    names = {op.op for op in found}
    candidates.float_ops.extend(sorted(names))
    result.tune_cfg = keep_float(result.tune_cfg, found, log)
    return {name: cfg for name, cfg in plan.items() if name not in names}


def _decide_latency(
    candidates: _Candidates, plan: dict[str, OpConfig], fmt: str, result: StaticResult
) -> dict[str, OpConfig]:
    """The measured decisions, recorded in ``result``; returns the ops left static.

    Decided on the plain model (the recipes change values, not the graph's shape), with
    minmax ranges: the requested ones (``auto``: chosen afterwards) go on the graph the
    decisions leave."""
    tune_cfg = candidates.tune_cfg
    for_decisions = range_choice.for_decisions(plan)
    decision = aware.latency_decision(
        candidates.prepared,
        tune_cfg,
        for_decisions,
        candidates.calib_dataloader,
        fmt,
        candidates.builder(for_decisions),
        list(candidates.dynamic_configs),
        candidates.output_error(),
    )
    fp32_decided = frozenset(decision.fp32_ops)
    dynamic_decided = frozenset(decision.dynamic_ops)
    changed: dict[tuple[str, str], OpConfig] = {
        key: OpConfig.fallback() for key in tune_cfg.ops if key[0] in fp32_decided
    }
    for key in tune_cfg.ops:
        if key[0] in dynamic_decided:
            changed[key] = result.dynamic_ops[key[0]] = candidates.dynamic_configs[key[0]]
    result.tune_cfg = result.tune_cfg.with_ops(changed)
    result.decision = decision
    decided = fp32_decided | dynamic_decided
    return {name: cfg for name, cfg in plan.items() if name not in decided}


def _resolve_ranges(
    candidates: _Candidates,
    plan: dict[str, OpConfig],
    resolving: set[str],
    fmt: str,
    fp32_ops: frozenset[str],
    result: StaticResult,
) -> dict[str, OpConfig]:
    """``auto`` algorithms chosen on the graph that ships (format, fp32 and dynamic ops
    decided): on Silero VAD the best algorithm for the QDQ graph is the worst for
    QOperator. Records the choice in ``result``; returns the resolved plan."""
    base = candidates.prepared.model
    dynamic_ops = frozenset(result.dynamic_ops)
    narrowable = None
    stats = candidates.stats
    values = sum(stats.count(name) for name in stats.tensor_names())
    if range_choice.narrowing_pays(len(plan), values):
        outputs = {output.name for output in base.graph.output}
        available = set(candidates.stats.tensor_names())
        narrowable = [
            name
            for name in ranges.activation_tensors(base, resolving)
            if name in available and name not in outputs
        ]
    backend = range_choice.Backend(
        lambda trial, scales: candidates.build(
            trial, fp32_ops, fmt, dynamic_ops, range_scales=scales
        ),
        candidates.output_error(),
        candidates.error_on,
    )
    plan, chosen = resolve(plan, backend, narrowable)
    result.tune_cfg, result.range_choice = record(result.tune_cfg, plan, chosen), chosen
    return plan


def _apply(
    candidates: _Candidates, plan: dict[str, OpConfig], fmt: str, result: StaticResult
) -> None:
    """The recipes (on the ops that stay int8), then the static pass over ``plan``, and
    float inputs for every op left float or dynamic."""
    from ..fallback import read_float_inputs

    prepared, tune_cfg = candidates.prepared, candidates.tune_cfg
    base, stats = prepared.model, candidates.stats
    chosen = recipes.requested(tune_cfg.options)
    if chosen and plan:  # only for the ops that stay int8
        base = recipes.apply(
            base,
            tune_cfg.options,
            lambda: ranges.limited_feeds(
                prepared.model, candidates.calib_dataloader, tune_cfg.calib_sampling_size
            ),
            plan,
        )
        model_key = f"{prepared.key}|{json.dumps(chosen, sort_keys=True, default=str)}"
        work = model_io.copy_model(base)
        stats = candidates.calibrate(base, model_key)
    else:
        work = model_io.copy_model(candidates.static_source(plan))
    if plan:
        work, result.ranges = static_pass(
            work,
            plan,
            tune_cfg,
            stats,
            fmt,
            range_choice.scales_from(result.tune_cfg.options),
            candidates.weight_cache,
        )
    # Ops kept float, and dynamic ops (they quantize their float input themselves; a
    # DequantizeLinear in front would be quantized twice, under the same name).
    fp32_now = [
        name
        for (name, _), cfg in result.tune_cfg.ops.items()
        if not cfg.quantized or cfg.mode == "dynamic"
    ]
    result.model = read_float_inputs(work, base, fp32_now)
    result.base = base
