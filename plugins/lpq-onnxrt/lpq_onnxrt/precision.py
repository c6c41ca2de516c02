"""What each op really runs in, read from the graph ONNX Runtime executes.

A tune_cfg is a request. In a QDQ model ORT fuses ``DequantizeLinear -> op ->
QuantizeLinear`` into an integer kernel only where it has one; elsewhere the op runs in
float between the pair. So the answer comes from the *optimized* graph of a session built
with the model's own session options: an op is int8 when a node named after it is an
integer kernel (QLinearConv, QGemm, MatMulInteger, ...), int4/uint4 for MatMulNBits,
fp16/bf16 when lpq's casts wrap it, fp32 otherwise. A weight-only model is read from its
own graph: the MatMulNBits / GatherBlockQuantized nodes lpq writes run as written, and a
session over an LLM would hold a second copy of its weights.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

#: ORT kernels that compute in 8-bit integers.
INTEGER_KERNELS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "QLinearAdd",
        "QLinearMul",
        "QLinearConcat",
        "QLinearGlobalAveragePool",
        "QLinearAveragePool",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearSoftmax",
        "QLinearWhere",
        "QLinearReduceMean",
        "QAttention",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QEmbedLayerNormalization",
        "QOrderedMatMul",
        "GatherBlockQuantized",
    }
)
_CAST_TYPES = {10: "fp16", 16: "bf16"}


def owner_of(node_name: str, names: Iterable[str]) -> str | None:
    """The longest op name that ``node_name`` is, or starts with followed by ``_``."""
    best = None
    for name in names:
        if (node_name == name or node_name.startswith(name + "_")) and (
            best is None or len(name) > len(best)
        ):
            best = name
    return best


def optimized_graph(model: onnx.ModelProto, options: dict[str, Any]) -> onnx.GraphProto:
    """The graph a session with ``options`` runs (ORT's optimizations applied)."""
    import onnx

    from .session import create_session

    with tempfile.TemporaryDirectory(prefix="lpq-precision-") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        create_session(model, {**options, "optimized_model_filepath": path})
        return onnx.load(path, load_external_data=False).graph


def quantized_ops(model: Any) -> dict[str, str]:
    """fp32 op name -> precision it runs in (see the module docstring)."""
    from .capability import build_capability
    from .model_io import prepare
    from .qmodel import QuantizedModel

    if not isinstance(model, QuantizedModel):
        return {name: "fp32" for name, _ in build_capability(prepare(model).model).opwise}
    names = [name for name, _ in model.tune_cfg.ops]
    found = dict.fromkeys(names, "fp32")
    for node in model.proto.graph.node:  # fp16/bf16 fallbacks: lpq's casts name the op
        if node.op_type == "Cast" and "__lpq_cast_in" in node.name:
            owner = node.name.split("__lpq_cast_in")[0]
            to = next((a.i for a in node.attribute if a.name == "to"), 1)
            if owner in found and to in _CAST_TYPES:
                found[owner] = _CAST_TYPES[to]
    dtypes = {
        name: cfg.weight.dtype if cfg.weight is not None else cfg.precision
        for (name, _), cfg in model.tune_cfg.ops.items()
    }
    modes = {cfg.mode for cfg in model.tune_cfg.ops.values() if cfg.quantized}
    # weight-only nodes run as lpq wrote them: the graph is the truth, no session needed
    # (an LLM's session costs a full copy of its weights)
    graph = (
        model.proto.graph
        if modes <= {"weight_only"}
        else optimized_graph(model.proto, dict(model.options))
    )
    for node in graph.node:
        owner = owner_of(node.name, names)
        if owner is None:
            continue
        if node.op_type == "GatherBlockQuantized":
            found[owner] = f"int{next((a.i for a in node.attribute if a.name == 'bits'), 4)}"
        elif node.op_type in INTEGER_KERNELS:
            found[owner] = "int8"
        elif node.op_type == "MatMulNBits":
            bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
            signed = dtypes.get(owner, "int4").startswith("int")
            found[owner] = f"{'int' if signed else 'uint'}{bits}"
    return found
