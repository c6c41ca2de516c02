"""Op signatures for the op latency table: what an op's int8 and fp32 cost depend on.

Two ops with one signature cost the same on one machine, in whichever model they sit:
op type and domain, every input's and output's element type and shape at the measuring
feed (weights included: a depthwise conv shows in its weight's shape), the attributes
(strides, pads, group, ...), and how it is quantized (weight and activation dtypes,
scheme, granularity; not the calibration algorithm, which changes values, not kernels).
The format (QDQ / QOperator) is added by the caller. Shapes come from ONNX shape
inference on the model with its inputs fixed to the feed's shapes; an op with a shape
that stays unknown has no signature (it is measured in its model, never looked up).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import model_io, weights
from ..graph import dim_sizes

if TYPE_CHECKING:
    import onnx

    from lpq import OpConfig

log = logging.getLogger(__name__)


def signatures(
    model: onnx.ModelProto,
    plan: Mapping[str, OpConfig],
    feed: Mapping[str, np.ndarray],
) -> dict[str, dict[str, Any] | None]:
    """Per op of ``plan``: its signature without the format, or None (shapes unknown).
    Empty when the model's shapes cannot be inferred (e.g. over the protobuf limit).
    Inferred on the graph with the weights as typed inputs, not values (a weight's
    signature is its type and shape)."""
    import onnx

    fixed = weights.for_shape_inference(model)
    if fixed.ByteSize() >= model_io.PROTO_LIMIT:
        return {}
    del fixed.graph.value_info[:]  # inferred afresh at the feed's shapes (no stale "N")
    for value in fixed.graph.input:
        if value.name not in feed:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, np.shape(feed[value.name]), strict=False):
            dim.Clear()
            dim.dim_value = int(size)
    try:
        inferred = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    except Exception as exc:  # any failure only means no table lookups
        log.info("op latency table: shapes not inferred (%s)", exc)
        return {}
    known = _tensor_types(inferred.graph)
    found: dict[str, dict[str, Any] | None] = {}
    for node in inferred.graph.node:
        if node.name not in plan:
            continue
        inputs = [known.get(name) if name else "" for name in node.input]
        outputs = [known.get(name) for name in node.output]
        if any(entry is None for entry in (*inputs, *outputs)):
            found[node.name] = None
            continue
        cfg = plan[node.name].to_json()
        for part in ("weight", "activation"):
            if isinstance(cfg.get(part), dict):
                cfg[part] = {k: v for k, v in cfg[part].items() if k != "algorithm"}
        found[node.name] = {
            "op_type": node.op_type,
            "domain": node.domain or "ai.onnx",
            "inputs": inputs,
            "outputs": outputs,
            "attributes": _attributes(node.attribute),
            "config": cfg,
        }
    return found


def _tensor_types(graph: onnx.GraphProto) -> dict[str, list[Any]]:
    """Tensor name -> [element type, dims] where every dim is known."""
    known: dict[str, list[Any]] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        dims = dim_sizes(value)
        if dims is not None and all(d is not None for d in dims):
            known[value.name] = [int(value.type.tensor_type.elem_type), dims]
    for init in graph.initializer:
        known[init.name] = [int(init.data_type), [int(d) for d in init.dims]]
    return known


def _attributes(attributes: Sequence[onnx.AttributeProto]) -> dict[str, Any]:
    """Scalar and list attributes by name (tensor and graph attributes by their kind only)."""
    from onnx import helper

    out: dict[str, Any] = {}
    for attribute in attributes:
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            out[attribute.name] = value.decode("utf-8", "replace")
        elif isinstance(value, int | float | str):
            out[attribute.name] = value
        elif isinstance(value, list) and all(isinstance(v, int | float) for v in value):
            out[attribute.name] = list(value)
        else:
            out[attribute.name] = type(value).__name__
    return out
