"""Which precision each op really runs in, read from the converted ``.tflite``.

Quantizers may leave an op in float without saying so (no int8 kernel, a weight below
the converter's size threshold, a neighbour that forced a float path). lpq therefore
reports counts and per-op tables from the file: an op whose output tensor is int8 / int16
runs in that integer precision; a float op whose weight is an int8 constant is a
dynamic-range (hybrid) op, int8; a float op fed float16 weights through a DEQUANTIZE is
fp16; anything else is fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import graph as graph_mod
from .graph import Graph, Op

_INTEGER = {np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8", np.dtype(np.int16): "int16"}


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


def op_precision(converted: Graph, op: Op) -> str:
    if not op.outputs:
        return "fp32"
    out = np.dtype(converted.tensors[op.outputs[0]].dtype)
    if out in _INTEGER:
        return _INTEGER[out]
    producers = converted.producers()
    for index in op.inputs:
        if index < 0:
            continue
        tensor = converted.tensors[index]
        if tensor.buffer is not None and np.dtype(tensor.dtype) == np.int8:
            return "int8"  # dynamic range: int8 weights, activations quantized at run time
        source = producers.get(index)
        if source is not None and source.op_type == "DEQUANTIZE" and source.inputs:
            origin = converted.tensors[source.inputs[0]]
            if origin.buffer is not None and np.dtype(origin.dtype) == np.float16:
                return "fp16"
    return "fp32"


def quantized_ops(model: Any) -> dict[str, str]:
    """The ``lpq_quantized_ops`` answer: fp32 op name -> precision found in the file."""
    from .capability import quantizable_ops
    from .model_io import prepare
    from .qmodel import QuantizedModel

    if not isinstance(model, QuantizedModel):
        return {name: "fp32" for name, _ in quantizable_ops(prepare(model))}
    converted = graph_mod.read(model.content)
    matched = match_ops(model.float_ops, converted)
    return {
        name: op_precision(converted, matched[name]) if name in matched else "fp32"
        for name in model.quantizable
    }
