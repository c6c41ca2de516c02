"""Writing ``com.microsoft.MatMulNBits`` nodes from :mod:`lpq.weight_only` results.

lpq writes the nodes itself (rather than through ORT's ``MatMulNBitsQuantizer``) so that
any algorithm's codes go in exactly as computed, 4- or 8-bit, with *integer* zero points
only: float zero points (ORT's HQQ output) leave the fast kernel (13x slower than fp32 on
SmolLM2). The layout is :func:`lpq.weight_only.pack_matmulnbits`, checked against ORT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lpq.weight_only import BlockQuantized, pack_matmulnbits

if TYPE_CHECKING:
    import onnx

MS_DOMAIN = "com.microsoft"


def node_name(name: str, bits: int) -> str:
    """The MatMulNBits node's name: the MatMul's, so precision reports find its owner."""
    return f"{name}_Q{bits}"


def ensure_ms_opset(model: onnx.ModelProto) -> None:
    """Import the ``com.microsoft`` domain (version 1) unless the model already does."""
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.add(domain=MS_DOMAIN, version=1)


def replace_matmul(
    model: onnx.ModelProto, node: onnx.NodeProto, quantized: BlockQuantized, accuracy_level: int
) -> onnx.NodeProto:
    """Swap MatMul ``node`` for a MatMulNBits reading the same input and writing the same
    output; the float weight initializer is removed when nothing else reads it."""
    import onnx
    from onnx import numpy_helper

    packed = pack_matmulnbits(quantized)
    base = node_name(node.name, packed.bits)
    inits = [
        numpy_helper.from_array(packed.b, base + "_B"),
        numpy_helper.from_array(packed.scales.astype(np.float32), base + "_scales"),
    ]
    inputs = [node.input[0], inits[0].name, inits[1].name]
    if packed.zero_points is not None:
        inits.append(numpy_helper.from_array(packed.zero_points, base + "_zero_points"))
        inputs.append(inits[-1].name)
    new = onnx.helper.make_node(
        "MatMulNBits",
        inputs,
        list(node.output),
        name=base,
        domain=MS_DOMAIN,
        accuracy_level=int(accuracy_level),
        **packed.attributes(),
    )
    weight = node.input[1]
    position = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    model.graph.node.insert(position, new)
    model.graph.initializer.extend(inits)
    if not any(weight in n.input for n in model.graph.node):
        for init in model.graph.initializer:
            if init.name == weight:
                model.graph.initializer.remove(init)
                break
    ensure_ms_opset(model)
    return new
