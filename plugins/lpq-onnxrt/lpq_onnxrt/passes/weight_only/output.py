"""The model the pass writes: a shell of the input (:func:`lpq_onnxrt.weights.shell`)
that MatMulNBits nodes, the float initializers still read, and the report go into."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lpq.weight_only import BlockQuantized

from ... import weights
from .nodes import replace_matmul

if TYPE_CHECKING:
    import onnx

METADATA_KEY = "lpq_weight_only"


class Output:
    """The new model, written tensor by tensor from ``src`` (only read)."""

    def __init__(self, src: onnx.ModelProto) -> None:
        self.src = src
        self.inits = {init.name: init for init in src.graph.initializer}
        self.model = weights.shell(src)
        self.names: set[str] = set()  # initializers written so far
        self.written: dict[str, int] = {}  # MatMulNBits node name -> bits

    def matmul(self, name: str, quantized: BlockQuantized, level: int) -> None:
        """MatMul ``name`` as a MatMulNBits node with ``quantized`` weights."""
        node = next(n for n in self.model.graph.node if n.name == name)
        new = replace_matmul(self.model, node, quantized, level)
        self.written[new.name] = quantized.bits
        self.names.update(i for i in new.input[1:] if i)

    def ensure(self, names: Iterable[str]) -> None:
        """Copy the float initializers ``names`` into the output model (once)."""
        for name in names:
            if name in self.inits and name not in self.names:
                self.model.graph.initializer.append(self.inits[name])
                self.names.add(name)

    def fill_initializers(self) -> None:
        """Copy every float initializer the output model still reads (norm scales, the
        embedding table, float MatMul weights), in the input model's order."""
        graph = self.model.graph
        read = {name for node in graph.node for name in node.input}
        read |= {value.name for value in graph.output}
        read -= {name for node in graph.node for name in node.output}
        self.ensure(init.name for init in self.src.graph.initializer if init.name in read)

    def set_levels(self, by_bits: Mapping[int, int]) -> None:
        """``accuracy_level`` of every MatMulNBits written, by its bit width."""
        for node in self.model.graph.node:
            if node.name not in self.written:
                continue
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = by_bits[self.written[node.name]]


def share_tied_table(model: onnx.ModelProto, head: str, table: str) -> bool:
    """A float tied ``lm_head``: the embedding ``table`` (a separate initializer equal to
    the head's weight transposed, as ORT's constant folding leaves the builder's
    ``Transpose(lm_head weight)``) becomes that Transpose again, so the file holds the
    table once. The table initializer is dropped when ``model`` has it. Returns whether
    it changed the model."""
    import onnx

    node = next((n for n in model.graph.node if n.name == head), None)
    if node is None or node.op_type != "MatMul":
        return False
    for init in model.graph.initializer:
        if init.name == table:
            model.graph.initializer.remove(init)
            break
    transpose = onnx.helper.make_node(
        "Transpose", [node.input[1]], [table], name=f"{table}__lpq_tied", perm=[1, 0]
    )
    model.graph.node.insert(0, transpose)
    return True


def write_report(model: onnx.ModelProto, report: Mapping[str, Any]) -> None:
    """The pass's report as JSON in ``model``'s ``metadata_props`` (replacing one)."""
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(report, default=str)


def read_report(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The pass's report from a quantized model's ``metadata_props`` (None if absent)."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return dict(json.loads(prop.value))
    return None
