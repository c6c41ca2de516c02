"""Make ops the tune_cfg leaves in float really run in float.

In a QDQ model an fp32 op may still read a dequantized activation (when the op before
it is quantized and its output carries a QuantizeLinear/DequantizeLinear pair). ONNX
Runtime's ``WeightBiasQuantization`` graph transformer, on at the default optimization
level, then quantizes that op's float weights at session load - silently, with its own
settings - so a "fallback" Gemm is int8 after all and can lose the accuracy the fallback
was meant to keep. Reading the float tensor in front of the pair instead keeps the op in
float in every ORT session, the user's own included; pairs left without readers go.

The rewiring reads the tensor in front of the pair where it is the very tensor the op read
in the fp32 model: same name *and* same producing node. Where it is not, the quantizer
folded a Relu/Clip into the pair (a zero point at the range's end clamps like the
activation; ORT even gives the producer's output the Relu's old name): the pair stays (its
producer is int8 only with a quantized output) and the op reads it through a float copy
of that Relu/Clip, which is exact and stops ORT from quantizing the op.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


def read_float_inputs(
    model: onnx.ModelProto, fp32_model: onnx.ModelProto, float_ops: Iterable[str]
) -> onnx.ModelProto:
    """Rewire ``float_ops`` (node names) to bypass activation Q/DQ pairs; in place."""
    names = set(float_ops)
    if not names:
        return model
    fp32_inputs = {node.name: list(node.input) for node in fp32_model.graph.node}
    fp32_nodes = {out: node for node in fp32_model.graph.node for out in node.output}
    fp32_producer = {out: node.name for out, node in fp32_nodes.items()}
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    added: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.name not in names:
            continue
        for index, tensor in enumerate(node.input):
            dq = producer.get(tensor)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = producer.get(dq.input[0])
            original = fp32_inputs.get(node.name, [])
            if q is None or index >= len(original):
                continue  # a quantized weight (initializer), not an activation
            if q.op_type == "QuantizeLinear":
                source = q.input[0]
                made_by = producer[source].name if source in producer else None
                if original[index] == source and fp32_producer.get(source) == made_by:
                    node.input[index] = source
                    continue
            # Otherwise an int8 op (QOperator) writes the tensor, or a Relu/Clip was folded.
            folded = fp32_nodes.get(original[index])
            if folded is not None and folded.op_type in ("Relu", "Clip"):
                # Keep the pair (the producer stays int8 only with its output quantized)
                # and read it through a float Relu/Clip: the op no longer reads a
                # DequantizeLinear, so ORT leaves it in float.
                node.input[index] = _float_copy(folded, tensor, node.name, added)
    graph.node.extend(added)
    _drop_unread_pairs(model)
    return model


def _float_copy(
    activation: onnx.NodeProto, source: str, reader: str, added: list[onnx.NodeProto]
) -> str:
    """A float copy of ``activation`` (Relu/Clip) reading ``source``, for ``reader``."""
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(activation)
    copy.name = f"{activation.name}__lpq_float_{reader}"
    copy.input[0] = source
    del copy.output[:]
    copy.output.append(f"{copy.name}_out")
    added.append(copy)
    return str(copy.output[0])


def _drop_unread_pairs(model: onnx.ModelProto) -> None:
    from .graph import graph_reads

    graph = model.graph
    outputs = {out.name for out in graph.output}
    changed = True
    while changed:
        read = graph_reads(graph) | outputs
        unread = [
            node
            for node in graph.node
            if node.op_type in ("QuantizeLinear", "DequantizeLinear")
            and not any(out in read for out in node.output)
        ]
        changed = bool(unread)
        for node in unread:
            graph.node.remove(node)
    from .graph import graph_reads

    used = graph_reads(graph)
    for init in [init for init in graph.initializer if init.name not in used]:
        graph.initializer.remove(init)
