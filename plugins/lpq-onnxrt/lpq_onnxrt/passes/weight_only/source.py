"""Reading the input model: MatMul weights, their shapes, input ranks (never written)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lpq import ConfigError

from ... import weights

if TYPE_CHECKING:
    import onnx


def _no_weight(node: onnx.NodeProto) -> ConfigError:
    return ConfigError(
        f"MatMul {node.name!r} has no constant weight to quantize",
        hint="keep it fp32 (weight-only quantization needs an initializer as input B)",
    )


def weight(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """The float32 constant weight (input B) of a MatMul."""
    for init in model.graph.initializer:
        if init.name == node.input[1]:
            return np.asarray(weights.array(init), dtype=np.float32)
    raise _no_weight(node)


def rows_of(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """K of a MatMul's constant weight, from its header (no data read)."""
    for init in model.graph.initializer:
        if init.name == node.input[1]:
            return int(init.dims[0])
    raise _no_weight(node)


def shapes(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """(K, N) of every MatMul with a 2-D constant weight, by node name."""
    inits = {init.name: init for init in model.graph.initializer}
    return {
        node.name: (int(inits[node.input[1]].dims[0]), int(inits[node.input[1]].dims[1]))
        for node in model.graph.node
        if node.op_type == "MatMul"
        and len(node.input) > 1
        and node.input[1] in inits
        and len(inits[node.input[1]].dims) == 2
    }


def input_rank(model: onnx.ModelProto, name: str) -> int | None:
    """The rank a graph input or value_info declares for tensor ``name``."""
    for value in [*model.graph.input, *model.graph.value_info]:
        if value.name == name and value.type.tensor_type.HasField("shape"):
            return len(value.type.tensor_type.shape.dim)
    return None
