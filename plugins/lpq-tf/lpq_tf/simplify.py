"""Exact fp32 rewrites of a float ``.tflite`` that int8 pays for (part of
:func:`lpq_tf.graph.normalize`): standalone activations fused into the op before them,
and weights unpacked by ops (float16 or sparse constants) made constants.

A standalone RELU, RELU6 or RELU_N1_TO_1 after a conv, an add or a multiply is what the
TFLite converter fuses into that op (its ``fused_activation_function``), and what
MediaPipe's published models keep as ops of their own (BlazeFace: 17 RELUs after its
residual ADDs). In fp32 XNNPACK fuses them itself. ai-edge-quantizer's int8 graph keeps
them apart, and XNNPACK does not take those standalone int8 RELUs: BlazeFace's int8 model
ran in 18 delegate partitions with LiteRT's own kernels between them, 3.6 ms against
fp32's 0.65 ms. With the activations fused before quantizing it runs in one partition,
0.43 ms (1.5x fp32), and the fp32 model computes bit for bit the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .rewrite import editable, pack

if TYPE_CHECKING:
    from .graph import Graph

#: Standalone activation ops a ``fused_activation_function`` of the same name replaces.
ACTIVATIONS = frozenset({"RELU", "RELU6", "RELU_N1_TO_1"})
#: Ops whose options carry a fused activation.
FUSING = frozenset({"ADD", "SUB", "MUL", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"})


@dataclass(frozen=True)
class Fusion:
    """An activation op (index ``activation``) fused into the op before it
    (``producer``); ``tensor`` is the one between them, left unused."""

    activation: int
    producer: int
    tensor: int
    kind: str


def fusions(graph: Graph) -> list[Fusion]:
    """The activation ops of ``graph`` that can be fused: their input is written by a
    :data:`FUSING` op and read by nothing else (not a graph output either)."""
    readers: dict[int, int] = {}
    for op in graph.ops:
        for tensor in op.inputs:
            readers[tensor] = readers.get(tensor, 0) + 1
    for tensor in graph.outputs:
        readers[tensor] = readers.get(tensor, 0) + 1
    producer = {tensor: op for op in graph.ops for tensor in op.outputs}
    found = []
    for op in graph.ops:
        if op.op_type not in ACTIVATIONS or len(op.inputs) != 1:
            continue
        before = producer.get(op.inputs[0])
        if before is None or before.op_type not in FUSING or len(before.outputs) != 1:
            continue
        if readers.get(op.inputs[0]) == 1:
            found.append(Fusion(op.index, before.index, op.inputs[0], op.op_type))
    return found


def fuse(model: Any, found: list[Fusion]) -> tuple[set[int], set[int]]:
    """Apply ``found`` to ``model`` (a ``schema.ModelT``) where the producer has no fused
    activation yet: the producer takes the activation and writes the activation's output.
    Returns the operator and tensor indices now unused (the caller drops them, the
    tensors with :func:`lpq_tf.rewrite.drop_tensors`)."""
    from ai_edge_litert import schema_py_generated as schema

    operators = model.subgraphs[0].operators
    dropped_ops, dropped_tensors = set(), set()
    for fusion in found:
        options = operators[fusion.producer].builtinOptions
        if getattr(options, "fusedActivationFunction", None) != schema.ActivationFunctionType.NONE:
            continue
        options.fusedActivationFunction = getattr(schema.ActivationFunctionType, fusion.kind)
        operators[fusion.producer].outputs = list(operators[fusion.activation].outputs)
        dropped_ops.add(fusion.activation)
        dropped_tensors.add(fusion.tensor)
    return dropped_ops, dropped_tensors


#: Ops that only unpack a constant weight: float16 -> float32, sparse -> dense.
UNPACKING = frozenset({"DEQUANTIZE", "DENSIFY"})


@dataclass(frozen=True)
class Unpacked:
    """Chains of :data:`UNPACKING` ops over constants: the ops, and the tensors other ops
    read from them (made constants when folded)."""

    ops: tuple[int, ...]
    weights: tuple[int, ...]
    #: the chains' other outputs, unused once folded
    inner: tuple[int, ...]
    #: a DENSIFY is among them (its values need LiteRT: the sparse format is LiteRT's)
    sparse: bool


def unpacked(graph: Graph) -> Unpacked:
    """The weight-unpacking chains of ``graph``: MediaPipe stores weights as float16
    behind DEQUANTIZE, and its pose detector sparse behind DENSIFY then DEQUANTIZE. Left
    in, a conv's weight is an op's output: ai-edge-quantizer quantizes it as an activation
    (zero point -128) and LiteRT then has no int8 conv kernel for it."""
    constant = {t.index for t in graph.tensors if t.buffer is not None}
    ops: list[Any] = []
    made: set[int] = set()
    for op in graph.ops:  # execution order: a chain's first op comes first
        inputs = [i for i in op.inputs if i >= 0]
        if op.op_type in UNPACKING and inputs and all(i in constant | made for i in inputs):
            ops.append(op)
            made.update(op.outputs)
    chain = {op.index for op in ops}
    read = {i for op in graph.ops if op.index not in chain for i in op.inputs} | set(graph.outputs)
    weights = tuple(sorted(t for t in made if t in read))
    inner = tuple(sorted(t for t in made if t not in read))
    sparse = any(op.op_type == "DENSIFY" for op in ops)
    return Unpacked(tuple(op.index for op in ops), weights, inner, sparse)


def unpacked_values(content: bytes, graph: Graph, chains: Unpacked) -> dict[int, np.ndarray]:
    """The values of ``chains.weights``: float16 constants converted here; anything sparse
    computed by LiteRT itself (the sparse format is LiteRT's): the model run once on zeros
    with those tensors made outputs of it (an intermediate tensor read back after a run
    can hold nothing: LiteRT unpacks constant weights where it sees fit)."""
    if not chains.sparse:
        values = {}
        for index in chains.weights:
            producer = next(op for op in graph.ops if index in op.outputs)
            source = graph.constant(producer.inputs[0])
            assert source is not None
            values[index] = source.astype(np.float32)
        return values
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    model = editable(content)
    subgraph = model.subgraphs[0]
    first = len(subgraph.outputs)
    subgraph.outputs = [*subgraph.outputs, *chains.weights]
    model.signatureDefs = []  # the signature would hide the added outputs
    # LiteRT's own kernels: XNNPACK takes float16 weights as they are and leaves the
    # DEQUANTIZE outputs unwritten.
    interpreter = Interpreter(
        model_content=pack(model, len(content) * 2),
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        shape = [d if d > 0 else 1 for d in detail["shape_signature"]]
        interpreter.resize_tensor_input(detail["index"], shape)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
    interpreter.invoke()
    details = interpreter.get_output_details()
    return {
        index: np.array(interpreter.get_tensor(details[first + k]["index"]))
        for k, index in enumerate(chains.weights)
    }
