"""Capturing per-op activations and weights of fp32 and quantized LiteRT models.

The model runs in LiteRT with every intermediate tensor preserved (the interpreter's
``experimental_preserve_all_tensors``, which also keeps ops out of the XNNPACK delegate
so their outputs exist). Results are keyed by lpq's fp32 op names, which are Keras layer
names where lpq could map them, not the TFLite tensor names the TFLite quantization
debugger reports. Quantized tensors are dequantized with their own scale and zero point.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from lpq import ConfigError, Inspection

from . import graph as graph_mod
from .capability import quantizable_ops
from .model_io import prepare
from .naming import match_ops
from .qmodel import QuantizedModel
from .runtime import Runner


def _weights(converted: graph_mod.Graph, op: graph_mod.Op) -> dict[str, np.ndarray]:
    producers = converted.producers()
    found: dict[str, np.ndarray] = {}
    for index in op.inputs:
        if index < 0:
            continue
        tensor = converted.tensors[index]
        source = producers.get(index)
        if tensor.buffer is None and source is not None and source.op_type == "DEQUANTIZE":
            tensor = converted.tensors[source.inputs[0]]
        values = converted.constant(tensor.index)
        if values is None or values.dtype == np.int32:  # int32: biases of int8 ops, shapes
            continue
        found[tensor.name] = graph_mod.dequantize(tensor, values)
    return found


def inspect_tensor(
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: str,
    iteration: int | None,
) -> Inspection:
    """The ``lpq_inspect_tensor`` answer: weights and/or per-batch activations of the ops
    named (default: the quantizable ones), under their fp32 names, dequantized."""
    if kind not in ("activation", "weight", "both"):
        raise ConfigError(
            f"unknown inspection kind {kind!r}", hint="use activation, weight or both"
        )
    if isinstance(model, QuantizedModel):
        content, float_ops, default = model.content, model.float_ops, model.quantizable
    else:
        prepared = prepare(model)
        content, float_ops = prepared.float_tflite, prepared.ops()
        default = [name for name, _ in quantizable_ops(prepared)]
    converted = graph_mod.read(content)
    matched = match_ops(float_ops, converted)
    names = list(op_names) if op_names is not None else list(default)
    missing = [name for name in names if name not in matched]
    if missing:
        raise ConfigError(
            f"op(s) {', '.join(missing[:5])} are not in the model",
            hint="inspect ops by their fp32 names (those in the capability)",
        )
    result = Inspection()
    if kind in ("weight", "both"):
        for name in names:
            values = _weights(converted, matched[name])
            if values:
                result.weights[name] = values
    if kind == "weight":
        return result
    runner = Runner(content, preserve=True)
    for name in names:
        result.activations[name] = []
    for batch, (arrays, _) in enumerate(runner.batches(dataloader)):
        if iteration is not None and batch >= iteration:
            break
        runner.run(arrays)
        for name in names:
            tensor = converted.tensors[matched[name].outputs[0]]
            value = runner.interpreter.get_tensor(tensor.index)
            result.activations[name].append(graph_mod.dequantize(tensor, value))
    return result
