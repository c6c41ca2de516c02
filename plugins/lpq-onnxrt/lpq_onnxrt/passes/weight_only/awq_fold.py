"""Where AWQ's per-input-channel scales can go in an ONNX graph.

AWQ quantizes ``s * W`` and needs the MatMul's input divided by ``s``. That division must
be folded into the op that produces the input, or the model gets slower, and it must not
change anything else the producer feeds. So a fold is allowed only when:

- the producer is a normalization whose scale (and bias) are constants used by it alone
  (``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization``,
  ``LayerNormalization``, ``SkipLayerNormalization``, ``RMSNormalization``), or a ``Mul``
  by such a constant of shape (K,);
- the tensor is the producer's first output, not a graph output, and every consumer is a
  MatMul with a constant 2-D weight: those quantized with AWQ (same bits, block size and
  scheme, searched together on their concatenated weights, as AWQ does for q/k/v) and
  float ones (their weight rows are multiplied by ``s``, exactly).

Anything else (an attention output feeding ``o_proj``, the ``Mul`` of SwiGLU feeding
``down_proj``) is reported as skipped with the reason, and that MatMul falls back to RTN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

#: Normalizations and the input positions of their scale and (optional) bias.
NORM_PARAMS = {
    "SimplifiedLayerNormalization": (1, None),
    "RMSNormalization": (1, None),
    "LayerNormalization": (1, 2),
    "SkipSimplifiedLayerNormalization": (2, None),
    "SkipLayerNormalization": (2, 3),
}


@dataclass(frozen=True)
class FoldSite:
    """A foldable AWQ group: the producer's constants to divide by ``s`` and the MatMuls
    (quantized with AWQ, or float) that read the tensor."""

    tensor: str
    divide: tuple[str, ...]
    awq: tuple[str, ...]
    floats: tuple[str, ...]


def _uses(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    uses: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    return uses


def _divisible(
    model: onnx.ModelProto, producer: onnx.NodeProto, uses: Mapping[str, list[onnx.NodeProto]]
) -> tuple[str, ...] | str:
    """The producer's constants to divide by ``s``, or why there are none."""
    inits = {init.name: init for init in model.graph.initializer}
    if producer.op_type in NORM_PARAMS:
        positions = [p for p in NORM_PARAMS[producer.op_type] if p is not None]
        names = [
            producer.input[p] for p in positions if p < len(producer.input) and producer.input[p]
        ]
    elif producer.op_type == "Mul":
        names = [name for name in producer.input if name in inits][:1]
    else:
        return (
            f"its input comes from {producer.op_type} {producer.name!r}, "
            "which has no scale to fold into"
        )
    for name in names:
        init = inits.get(name)
        if init is None or len(init.dims) != 1 or len(uses.get(name, [])) != 1:
            return f"{producer.op_type} {producer.name!r} has no per-channel constant of its own"
    return (
        tuple(names) if names else f"{producer.op_type} {producer.name!r} has no constant operand"
    )


def fold_site(
    model: onnx.ModelProto, tensor: str, awq: Mapping[str, tuple[object, ...]], quantized: set[str]
) -> FoldSite | str:
    """The :class:`FoldSite` for MatMul input ``tensor``, or the reason AWQ is skipped.

    ``awq`` maps the AWQ MatMuls reading ``tensor`` to their (bits, block, scheme) key;
    ``quantized`` names every MatMul quantized by this pass.
    """
    uses = _uses(model)
    producer = next((n for n in model.graph.node if tensor in n.output), None)
    if producer is None or producer.output[0] != tensor:
        return "its input is a graph input or a secondary output"
    if tensor in {o.name for o in model.graph.output}:
        return "its input is also a graph output"
    if len(set(awq.values())) > 1:
        return "the MatMuls sharing its input use different bits/block sizes/schemes"
    inits = {init.name for init in model.graph.initializer}
    floats = []
    for node in uses.get(tensor, []):
        if node.name in awq:
            continue
        if node.op_type != "MatMul" or node.input[0] != tensor or node.input[1] not in inits:
            return f"its input also feeds {node.op_type} {node.name!r}"
        if node.name in quantized:
            return f"its input also feeds {node.name!r}, which is quantized without AWQ"
        floats.append(node.name)
    divide = _divisible(model, producer, uses)
    if isinstance(divide, str):
        return divide
    return FoldSite(tensor, divide, tuple(awq), tuple(floats))


def apply_fold(model: onnx.ModelProto, site: FoldSite, scales: np.ndarray) -> None:
    """Divide the producer's constants by ``scales`` and multiply float MatMul weight rows
    by them (the quantized AWQ weights are written by the caller)."""
    from onnx import numpy_helper

    inits = {init.name: init for init in model.graph.initializer}
    for name in site.divide:
        value = numpy_helper.to_array(inits[name]).astype(np.float32) / scales
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
    by_name = {node.name: node for node in model.graph.node}
    for matmul in site.floats:
        weight = inits[by_name[matmul].input[1]]
        value = numpy_helper.to_array(weight) * scales[:, None]
        weight.CopyFrom(numpy_helper.from_array(value.astype(np.float32), weight.name))
