"""lpq_quantize: turn a tune_cfg into a model by picking the pass that applies it.

* int8 ops (static, post-training) -> :mod:`lpq_mxnet.passes.static` (``quantize_net_v2``);
* bf16 fallbacks and no int8 op -> :func:`lpq_mxnet.lowp.cast_lowp` (MXNet's AMP pass);
* nothing quantized -> the fp32 graph as a hybridized block.

A Concat whose inputs' calibrated ranges cannot share one int8 range stays fp32
(:mod:`lpq_mxnet.shared_scale`).

With the ``latency_aware`` option (on for ``lpq quantize``), :mod:`lpq_mxnet.latency` then
keeps in fp32 the int8 ops that make the block slower on this machine; the block's
tune_cfg (its ``ModelInfo``) says what it runs, and its ``_lpq_latency`` attribute holds
the decision with the measurements.

MXNet 1.9 cannot mix int8 and bf16 in one graph, and does post-training static int8
only: anything else is a ConfigError.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from lpq import ConfigError, OpConfig, TuneConfig
from lpq.latency import enabled
from lpq.ranges import keep_float

from . import data, latency, shared_scale
from .lowp import cast_lowp
from .model_io import ModelInfo, fp32_graph, info_of
from .passes.static import quantize_static

log = logging.getLogger("lpq.mxnet")


def quantize(
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> Any:
    """A new block running ``model`` as ``tune_cfg`` says; ``model`` is not modified."""
    if train_func is not None:
        raise ConfigError(
            "the MXNet adaptor does post-training quantization only (no train_func / QAT)",
            hint="drop train_func, or use approach='static'",
        )
    first, batches = data.peek(calib_dataloader, "calibration")
    graph = fp32_graph(model, first)
    chosen = _quantized_ops(tune_cfg)
    lowp = {name: cfg.precision for (name, _), cfg in tune_cfg.ops.items() if _is_lowp(cfg)}
    if lowp:
        if chosen:
            raise ConfigError(
                f"MXNet 1.9 cannot mix int8 and {sorted(set(lowp.values()))} ops in one "
                f"graph ({', '.join(sorted(lowp))})",
                hint="fall these ops back to fp32 instead",
            )
        return cast_lowp(model, sorted(lowp), "bf16", tune_cfg=tune_cfg.to_json())
    ops = graph.tunable_ops()
    arrays = data.calibration_arrays(batches, graph.input_names, tune_cfg.calib_sampling_size)
    info = ModelInfo(graph.symbol, list(graph.input_names), "fp32", ops, tune_cfg.to_json())
    reference = graph.block(info)
    data.run(reference, [data.to_nd(a[:1]) for a in arrays])  # misfit data: a DataError now
    if not chosen:
        return reference
    unshareable = shared_scale.unshareable_ops(graph, chosen, arrays, tune_cfg.options)
    if unshareable:
        tune_cfg = keep_float(tune_cfg, unshareable, log)
        chosen = _quantized_ops(tune_cfg)
        info = ModelInfo(graph.symbol, list(graph.input_names), "fp32", ops, tune_cfg.to_json())
        if not chosen:
            return graph.block(info)
    planned = quantize_static(graph, chosen, arrays, info)
    if not enabled(tune_cfg.options):
        return planned
    decision, block = latency.choose(
        ops=ops,
        chosen=chosen,
        arrays=arrays,
        options=dict(tune_cfg.options),
        model_digest=latency.graph_digest(graph),
        build_int8=lambda rest: quantize_static(graph, rest, arrays, info),
        reference=reference,
        planned=planned,
    )
    # What the block now runs, decided: quantizing with it again gives the same block
    # without measuring anew (lpq_resolved_config).
    effective = tune_cfg.with_fallbacks(decision.keep_float).with_options({"latency_aware": False})
    block_info = info_of(block)
    if block_info is not None:
        block_info.tune_cfg = effective.to_json()
    setattr(block, latency.LATENCY_ATTR, decision.to_json())
    return block


def _quantized_ops(tune_cfg: TuneConfig) -> dict[str, OpConfig]:
    chosen = {}
    for (name, op_type), cfg in tune_cfg.ops.items():
        if not cfg.quantized:
            continue
        if cfg.precision not in ("int8", "uint8") or cfg.mode not in (None, "static"):
            raise ConfigError(
                f"op {name} ({op_type}): MXNet quantizes to static int8 only, not "
                f"{cfg.precision} {cfg.mode or ''}".rstrip(),
                hint="use precision int8 with mode static (see lpq capability show mxnet)",
            )
        chosen[name] = cfg
    return chosen


def _is_lowp(cfg: OpConfig) -> bool:
    return not cfg.quantized and cfg.precision != "fp32"


def resolved_config(model: Any) -> TuneConfig | None:
    """The ``lpq_resolved_config`` job: the tune_cfg a block lpq-mxnet built carries, the
    configuration it really is (Concats the shared-scale rule and ops latency-aware
    quantization kept fp32 as fallbacks, ``latency_aware`` off once decided); None for a
    block lpq did not build."""
    info = info_of(model)
    return TuneConfig.from_json(info.tune_cfg) if info is not None and info.tune_cfg else None
