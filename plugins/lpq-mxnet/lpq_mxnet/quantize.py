"""lpq_quantize: apply a tune_cfg to an MXNet model through ``quantize_net_v2``.

The tune_cfg becomes quantize_net_v2's arguments, layer by layer:

* **fallback** — every fp32 node not part of a quantized op goes into ``exclude_layers``
  (excluding any member of a oneDNN fusion group keeps the whole group in fp32, so only
  the groups of quantized ops are left out of the list);
* **calibration** — ``calib_mode="customize"`` with lpq-mxnet's collector, which applies
  each op's own algorithm (minmax / kl / percentile) and activation dtype;
* **granularity** — ``quantize_granularity`` for FullyConnected weights (MXNet applies one
  setting to every FullyConnected; Convolution weights are always per-channel in oneDNN).

The result is always re-hybridized with ``static_alloc`` and ``static_shape``: without
it the int8 graph runs slower than fp32.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from lpq import ConfigError, ModelError, OpConfig, TuneConfig

from . import data
from .calibration import Collector, plan_tensors
from .framework import mxnet, quiet
from .graph import graph_json, groups, is_quantized, op_nodes
from .model import INFO_ATTR, Graph, ModelInfo, to_graph

log = logging.getLogger(__name__)

_GRANULARITY = {"per_channel": "channel-wise", "per_tensor": "tensor-wise"}


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
        from .convert import convert

        return convert(model, sorted(lowp), "bf16", tune_cfg=tune_cfg.to_json())
    ops = graph.tunable_ops()
    info = ModelInfo(graph.symbol, list(graph.input_names), "fp32", ops, tune_cfg.to_json())
    arrays = data.calibration_arrays(batches, graph.input_names, tune_cfg.calib_sampling_size)
    reference = graph.block(info)
    data.run(reference, [data.to_nd(a[:1]) for a in arrays])  # misfit data: a DataError now
    if not chosen:
        return reference
    return _quantize_net(graph, chosen, arrays, info)


def fp32_graph(model: Any, example: Any = None) -> Graph:
    """``model`` as a graph (see :func:`to_graph`), refusing one already quantized."""
    graph = to_graph(model, example)
    if (graph.info is not None and graph.info.precision != "fp32") or is_quantized(graph.json()):
        raise ModelError(
            "the model is already quantized (or converted to bf16)",
            hint="pass the fp32 model: lpq quantizes from fp32",
        )
    return graph


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


def _granularity(chosen: dict[str, OpConfig], op_types: dict[str, str]) -> str:
    """quantize_net_v2's FullyConnected weight granularity for this tune_cfg.

    MXNet has one setting for every FullyConnected; when the tune_cfg mixes both, the
    more accurate per-channel wins (logged).
    """
    wanted = {
        cfg.weight.granularity
        for name, cfg in chosen.items()
        if op_types.get(name) == "FullyConnected" and cfg.weight is not None
    }
    if len(wanted) > 1:
        log.warning(
            "MXNet applies one weight granularity to every FullyConnected; "
            "the tune_cfg mixes per_channel and per_tensor: using per_channel"
        )
        return "channel-wise"
    for granularity in wanted:
        if granularity not in _GRANULARITY:
            raise ConfigError(
                f"weight granularity {granularity} is not one MXNet supports",
                hint="use per_channel or per_tensor",
            )
        return _GRANULARITY[granularity]
    return "channel-wise"


def _excluded(graph: Graph, fused: dict[str, Any], chosen: dict[str, OpConfig]) -> list[str]:
    """Every fp32 node outside the fusion groups of the ops to quantize."""
    kept: set[str] = set()
    for group in groups(fused):
        anchor = group.anchor
        if anchor is not None and anchor[0] in chosen:
            kept.update(name for name, _ in group.members)
    return [name for name, _ in op_nodes(graph.json()) if name not in kept]


def _quantize_net(
    graph: Graph, chosen: dict[str, OpConfig], arrays: list[Any], info: ModelInfo
) -> Any:
    mx = mxnet()
    from mxnet.contrib.quantization import quantize_net_v2

    fused = graph.fused_json()
    op_types = dict(info.ops)
    unknown = sorted(set(chosen) - set(op_types))
    if unknown:
        raise ConfigError(
            f"the tune_cfg quantizes ops the model does not have: {', '.join(unknown)}",
            hint="take op names from lpq capability / the adaptor's opwise capability",
        )
    collector = Collector(plan_tensors(fused, graph.input_names, chosen))
    calib = data.calibration_iter(arrays, graph.input_names)
    with quiet():
        try:
            qnet = quantize_net_v2(
                graph.block(hybridize=False),
                quantized_dtype="auto",
                quantize_mode="full",
                quantize_granularity=_granularity(chosen, op_types),
                exclude_layers=_excluded(graph, fused, chosen),
                calib_data=calib,
                calib_mode="customize",
                LayerOutputCollector=collector,
                num_calib_examples=len(arrays[0]),
                ctx=mx.cpu(),
            )
        except mx.base.MXNetError as exc:
            raise ModelError(
                f"MXNet failed to quantize the model: {str(exc).splitlines()[0][:300]}",
                hint="fall back the op named in the message (op_name_dict={name: 'fp32'})",
            ) from exc
        symbol = qnet(*[mx.sym.var(n) for n in graph.input_names])
    _check_calibrated(graph_json(symbol))
    qnet.hybridize(static_alloc=True, static_shape=True)
    setattr(
        qnet,
        INFO_ATTR,
        ModelInfo(symbol, list(graph.input_names), "int8", info.ops, info.tune_cfg),
    )
    return qnet


def _check_calibrated(quantized: dict[str, Any]) -> None:
    """Every int8 requantization point got a calibrated range. A missing one would make
    MXNet compute ranges at run time: slower and not what the tune_cfg asked for."""
    missing = []
    for node in quantized["nodes"]:
        attrs = node.get("attrs", {})
        needs_range = node["op"] in ("_contrib_quantize_v2", "_contrib_quantized_elemwise_add") or (
            node["op"].startswith(("_sg_mkldnn_", "_sg_onednn_"))
            and attrs.get("quantized", "").lower() == "true"
            and attrs.get("enable_float_output", "").lower() != "true"
        )
        if needs_range and "min_calib_range" not in attrs:
            missing.append(node["name"])
    if missing:
        raise ModelError(
            f"calibration produced no range for {', '.join(missing)}",
            hint="this is a bug in lpq-mxnet's calibration plan; please report it with the "
            "model (falling these ops back to fp32 avoids it)",
        )
