"""Which precision each op really runs in, read from the converted ``.tflite``.

Quantizers may leave an op in float without saying so (no int8 kernel, a weight below
the converter's size threshold, a neighbour that forced a float path). lpq therefore
reports counts and per-op tables from the file: an op whose output tensor is int8 / int16
runs in that integer precision; a float op whose weight is an int8 constant is a
dynamic-range (hybrid) op, int8; a float op fed float16 weights through a DEQUANTIZE is
fp16; anything else is fp32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import graph as graph_mod
from .capability import quantizable_ops
from .graph import Graph, Op
from .model_io import prepare
from .naming import match_ops
from .qmodel import QuantizedModel

_INTEGER = {np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8", np.dtype(np.int16): "int16"}


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
    if not isinstance(model, QuantizedModel):
        return {name: "fp32" for name, _ in quantizable_ops(prepare(model))}
    converted = graph_mod.read(model.content)
    matched = match_ops(model.float_ops, converted)
    return {
        name: op_precision(converted, matched[name]) if name in matched else "fp32"
        for name in model.quantizable
    }
