"""Editing models after quantization: the optional hooks ``lpq_set_tensor`` and
``lpq_quantize_input`` (``lpq_convert`` is :mod:`lpq_onnxrt.export`).

``set_tensor`` writes a new value into a weight or bias: a float initializer is replaced;
a quantized one (a ``DequantizeLinear`` fed by ``<name>_quantized``) is re-quantized with
its existing scale and zero point, so core-side algorithms such as bias correction work
on quantized models too. ``quantize_input`` removes the first ``QuantizeLinear`` after
each graph input and the last ``DequantizeLinear`` before each graph output, so callers
feed and read integer tensors; their scales and zero points go into the model's
metadata (``lpq.io.<tensor>``: JSON ``{"scale": ..., "zero_point": ..., "dtype": ...}``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np

import lpq

from .model_io import copy_model, to_proto
from .qmodel import QuantizedModel


def _initializers(proto: Any) -> dict[str, Any]:
    return {init.name: init for init in proto.graph.initializer}


def _array(init: Any) -> np.ndarray:
    from onnx import numpy_helper

    return np.asarray(numpy_helper.to_array(init))


def _replace_initializer(proto: Any, name: str, value: np.ndarray) -> None:
    from onnx import numpy_helper

    inits = _initializers(proto)
    new = numpy_helper.from_array(value, name)
    inits[name].CopyFrom(new)


def _dequantize_node_of(proto: Any, tensor_name: str) -> Any | None:
    """The DequantizeLinear that rebuilds ``tensor_name`` (a weight or bias) from ints."""
    inits = _initializers(proto)
    for node in proto.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        if node.input[0] == f"{tensor_name}_quantized" or node.output[0] == tensor_name:
            return node
    return None


def _requantize(
    value: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int, dtype: np.dtype
) -> np.ndarray:
    if scale.ndim == 1 and scale.size > 1:  # per channel along ``axis``
        shape = [1] * value.ndim
        shape[axis] = scale.size
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    info = np.iinfo(dtype)
    q = np.rint(value / scale) + zero_point.astype(np.int64)
    return np.clip(q, info.min, info.max).astype(dtype)


def set_tensor(model: Any, tensor_name: str, value: Any) -> Any:
    """``model`` (fp32 path/proto or :class:`QuantizedModel`) with ``tensor_name`` set."""
    quantized = model if isinstance(model, QuantizedModel) else None
    proto = copy_model(quantized.proto if quantized is not None else to_proto(model))
    value = np.asarray(value)
    inits = _initializers(proto)
    if tensor_name in inits:
        current = _array(inits[tensor_name])
        _check_shape(tensor_name, current.shape, value.shape)
        _replace_initializer(proto, tensor_name, value.astype(current.dtype))
    else:
        node = _dequantize_node_of(proto, tensor_name)
        if node is None:
            known = sorted(n.removesuffix("_quantized") for n in inits if n.endswith("_quantized"))
            raise lpq.ModelError(
                f"the model has no weight or bias tensor named {tensor_name!r}",
                hint=f"name a float initializer or one of the quantized tensors: "
                f"{', '.join(known[:12]) or 'none'}",
            )
        ints = _array(inits[node.input[0]])
        _check_shape(tensor_name, ints.shape, value.shape)
        scale = _array(inits[node.input[1]]).astype(np.float64)
        zero_point = _array(inits[node.input[2]]) if len(node.input) > 2 else np.zeros_like(scale)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        axis = axis % max(ints.ndim, 1)
        requantized = _requantize(value.astype(np.float64), scale, zero_point, axis, ints.dtype)
        _replace_initializer(proto, node.input[0], requantized)
    if quantized is not None:
        return replace(quantized, proto=proto)
    return proto


def _check_shape(name: str, expected: tuple[int, ...], got: tuple[int, ...]) -> None:
    if tuple(expected) != tuple(got):
        raise lpq.ModelError(
            f"tensor {name!r} has shape {tuple(expected)}, the new value {tuple(got)}",
            hint="pass a value of the tensor's own shape",
        )


def quantize_input(model: Any, options: dict[str, Any]) -> QuantizedModel:
    """Integer graph inputs and outputs: drop the boundary QuantizeLinear/DequantizeLinear."""
    if not isinstance(model, QuantizedModel):
        raise lpq.ModelError(
            "lpq_quantize_input needs a quantized model",
            hint="quantize it first (lpq.quantize), then make its inputs integer",
        )
    proto = copy_model(model.proto)
    graph = proto.graph
    inits = _initializers(proto)
    io: dict[str, dict[str, Any]] = {}
    if options.get("inputs", True):
        for graph_input in graph.input:
            node = _boundary_node(graph, "QuantizeLinear", lambda n: n.input[0], graph_input)
            if node is None:
                raise lpq.ModelError(
                    f"input {graph_input.name!r} is not quantized right away in this model",
                    hint="its first op stays in float; pass options={'inputs': False}",
                )
            io[graph_input.name] = _strip(graph, inits, node, graph_input, node.output[0])
    if options.get("outputs", True):
        for graph_output in graph.output:
            node = _boundary_node(graph, "DequantizeLinear", lambda n: n.output[0], graph_output)
            if node is None:
                raise lpq.ModelError(
                    f"output {graph_output.name!r} is computed in float in this model",
                    hint="its last op stays in float; pass options={'outputs': False}",
                )
            io[graph_output.name] = _strip(graph, inits, node, graph_output, node.input[0])
    for name, params in io.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = f"lpq.io.{name}", json.dumps(params)
    return replace(model, proto=proto)


def _boundary_node(graph: Any, op_type: str, end: Any, value_info: Any) -> Any | None:
    """The ``op_type`` node whose ``end(node)`` tensor is the graph boundary ``value_info``."""
    return next((n for n in graph.node if n.op_type == op_type and end(n) == value_info.name), None)


def _strip(graph: Any, inits: dict[str, Any], node: Any, value_info: Any, inner: str) -> dict:
    """Remove boundary ``node``: the tensor ``inner`` on its other side takes the boundary's
    name and integer type. Returns the scale and zero point the caller must apply."""
    scale, zero_point = _array(inits[node.input[1]]), _array(inits[node.input[2]])
    value_info.type.tensor_type.elem_type = inits[node.input[2]].data_type
    for other in graph.node:
        for names in (other.input, other.output):
            for i, name in enumerate(names):
                if name == inner:
                    names[i] = value_info.name
    graph.node.remove(node)
    return {
        "scale": scale.tolist(),
        "zero_point": zero_point.tolist(),
        "dtype": str(zero_point.dtype),
    }
