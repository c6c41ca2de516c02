"""Naming TFLite ops after the Keras layers they came from.

The converter names each op after its output tensor, a ``;``-joined list of TensorFlow
scopes such as ``functional_1/re_lu_1/Relu6;functional_1/conv2d_1/convolution``, where
every layer scope carries a tracing suffix (``conv2d`` -> ``conv2d_1``) and the last op
of the model is only ``StatefulPartitionedCall_1:0``. lpq maps each op back to the Keras
layer whose name (plus such suffixes) appears in a scope and whose class can produce that
op type, taking layers in model order; an op no scope names gets the only unused layer of
a fitting class, if there is exactly one. Ops that still match no layer (and every op of
a model without Keras layers) keep the first scope of their TFLite name.

A quantizer renames and inserts ops, so the same names are found again in a converted
model by :func:`match_ops` (precision and inspection report under the fp32 names).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .graph import Graph, Op

#: Keras layer classes that can become each TFLite op type (others: any layer).
_LAYER_CLASSES = {
    "CONV_2D": {"Conv2D", "Conv1D", "SeparableConv2D", "SeparableConv1D", "Conv3D"},
    "DEPTHWISE_CONV_2D": {
        "DepthwiseConv2D",
        "DepthwiseConv1D",
        "SeparableConv2D",
        "SeparableConv1D",
    },
    "TRANSPOSE_CONV": {"Conv2DTranspose", "Conv1DTranspose"},
    "FULLY_CONNECTED": {"Dense", "EinsumDense"},
    "BATCH_MATMUL": {"Dot", "EinsumDense", "MultiHeadAttention"},
    "ADD": {"Add"},
    "SUB": {"Subtract"},
    "MUL": {"Multiply"},
    "MEAN": {"GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D"},
    "AVERAGE_POOL_2D": {"AveragePooling2D", "AveragePooling1D"},
    "CONCATENATION": {"Concatenate"},
}


def _scopes(tensor_name: str) -> list[str]:
    """The scope components of a TFLite tensor name (model scope and op name dropped)."""
    found = []
    for alternative in tensor_name.split(";"):
        parts = alternative.split("/")
        found.extend(parts[1:-1])
    return found


def _matches(layer: str, scope: str) -> bool:
    return scope == layer or re.fullmatch(re.escape(layer) + r"(_\d+)+", scope) is not None


def op_names(graph: Graph, layers: Sequence[tuple[str, str]]) -> dict[int, str]:
    """lpq name of every op of ``graph`` (op index -> name), unique.

    ``layers`` are the Keras layers ``(name, class name)`` in model order; empty for
    SavedModels and ``.tflite`` files.
    """
    used: set[str] = set()
    names: dict[int, str] = {}
    unmatched = []
    for op in graph.model_ops():
        allowed = _LAYER_CLASSES.get(op.op_type)
        fitting = [(n, c) for n, c in layers if allowed is None or c in allowed]
        scopes = _scopes(graph.output_name(op))
        candidates = [n for n, _ in fitting if any(_matches(n, s) for s in scopes)]
        free = [n for n in candidates if n not in used]
        if free:
            names[op.index] = free[0]
            used.add(free[0])
        elif candidates:
            names[op.index] = candidates[0]
        else:
            unmatched.append(op)
    for op in unmatched:
        allowed = _LAYER_CLASSES.get(op.op_type)
        free = [n for n, c in layers if n not in used and allowed is not None and c in allowed]
        if len(free) == 1:
            names[op.index] = free[0]
            used.add(free[0])
        else:
            names[op.index] = graph.output_name(op).split(";")[0] or f"{op.op_type}_{op.index}"
    return _unique(names)


def _unique(names: dict[int, str]) -> dict[int, str]:
    """Second and later ops with the same name get ``name:2``, ``name:3``, ..."""
    seen: dict[str, int] = {}
    result = {}
    for index in sorted(names):
        name = names[index]
        seen[name] = seen.get(name, 0) + 1
        result[index] = name if seen[name] == 1 else f"{name}:{seen[name]}"
    return result


def match_ops(float_ops: Sequence[tuple[str, str, str]], converted: Graph) -> dict[str, Op]:
    """fp32 op name -> the op of ``converted`` that computes it.

    Matched by output tensor name (a quantizer that moves a graph output behind a
    DEQUANTIZE renames the op's tensor ``<name>1``), then, for what is left, by position
    among the ops of the same type.
    """
    ops = converted.model_ops()
    used: set[int] = set()
    found: dict[str, Op] = {}
    for name, op_type, tensor in float_ops:
        for op in ops:
            out = converted.output_name(op)
            renamed = out.startswith(tensor) and out[len(tensor) :].isdigit()
            if op.index not in used and op.op_type == op_type and (out == tensor or renamed):
                found[name] = op
                used.add(op.index)
                break
    for name, op_type, _ in float_ops:
        if name in found:
            continue
        rank = [n for n, t, _ in float_ops if t == op_type].index(name)
        same = [op for op in ops if op.op_type == op_type]
        if rank < len(same) and same[rank].index not in used:
            found[name] = same[rank]
            used.add(same[rank].index)
    return found
