"""The post-training static int8 pass: a tune_cfg applied through ``quantize_net_v2``.

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
from typing import Any

from lpq import ConfigError, ModelError, OpConfig

from .. import data
from ..calibration import Collector, plan_tensors
from ..framework import mxnet, quiet
from ..graph import graph_json, groups, op_nodes
from ..info import INFO_ATTR
from ..model_io import Graph, ModelInfo

log = logging.getLogger(__name__)

_GRANULARITY = {"per_channel": "channel-wise", "per_tensor": "tensor-wise"}


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


def quantize_static(
    graph: Graph, chosen: dict[str, OpConfig], arrays: list[Any], info: ModelInfo
) -> Any:
    """A new int8 block: ``chosen`` ops of the fp32 ``graph`` quantized, calibrated on
    ``arrays`` (one array of samples per input); ``info`` describes the fp32 model."""
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
