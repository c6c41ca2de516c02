"""Reading MXNet symbol graphs: the ops lpq tunes, oneDNN's fusion groups, and what a
quantized graph really runs.

lpq names an op by its node name in the fp32 symbol (``hybridsequential0_conv0_fwd``) and
types it by its MXNet operator (``Convolution``). oneDNN fuses a Convolution or
FullyConnected with the BatchNorm / activation / residual add that follow it into one
subgraph node (``_sg_mkldnn_conv``) and quantizes the group as a whole, so each group is
*one* tunable op, named after its Convolution / FullyConnected; the ops fused into it
follow it. The functions here read the graph's JSON (``{"nodes": [...], "heads": ...}``,
subgraph nodes carrying their inner graph under ``"subgraphs"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Op types that anchor a oneDNN fusion group (they carry weights).
WEIGHTED_OPS = ("Convolution", "FullyConnected")
#: Op types that can be quantized on their own (int8 kernels without weights).
ACTIVATION_OPS = ("Pooling", "Flatten", "Concat", "elemwise_add")
#: Op types whose int8 kernel requantizes its output to a calibrated range (Pooling,
#: Flatten and Concat pass their input's range on).
REQUANTIZING_OPS = (*WEIGHTED_OPS, "elemwise_add")
#: Every op type lpq-mxnet lists as tunable, in the capability YAML's terms.
TUNABLE_OPS = WEIGHTED_OPS + ACTIVATION_OPS
#: Prefix MXNet gives the node of an op it quantized on its own.
QUANTIZED_PREFIX = "quantized_"


@dataclass
class Group:
    """One node of a fused (or quantized) graph and the fp32 ops it runs.

    ``members`` are the fp32 ops inside, in order, as ``(name, op_type)``; for a node
    that is not a fused subgraph it is the node itself. ``head`` is the fp32 op whose
    output is the group's output. ``anchor`` is the op lpq tunes (``None``: none).
    """

    node: str
    op: str
    members: list[tuple[str, str]]
    head: str
    attrs: dict[str, str] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)

    @property
    def anchor(self) -> tuple[str, str] | None:
        for name, op_type in self.members:
            if op_type in WEIGHTED_OPS:
                return name, op_type
        if len(self.members) == 1 and self.members[0][1] in ACTIVATION_OPS:
            return self.members[0]
        return None

    @property
    def quantized(self) -> bool:
        """True when this node runs an int8 kernel."""
        if self.op.startswith("_contrib_quantized_"):
            return True
        return self.attrs.get("quantized", "").lower() == "true"


def graph_json(symbol: Any) -> dict[str, Any]:
    """The JSON of an MXNet symbol, keeping AMP casts (``tojson`` drops them by default)."""
    data: dict[str, Any] = json.loads(symbol.tojson(remove_amp_cast=False))
    return data


def op_nodes(graph: dict[str, Any]) -> list[tuple[str, str]]:
    """``(name, op_type)`` of every operator node (not variables), in graph order."""
    return [(n["name"], n["op"]) for n in graph["nodes"] if n["op"] != "null"]


def groups(graph: dict[str, Any]) -> list[Group]:
    """One :class:`Group` per operator node of a (fused or quantized) graph, in order."""
    nodes = graph["nodes"]
    found = []
    for node in nodes:
        if node["op"] == "null":
            continue
        inputs = [nodes[i[0]]["name"] for i in node.get("inputs", [])]
        subgraphs = node.get("subgraphs") or []
        if subgraphs:
            inner = subgraphs[0]["nodes"]
            members = [(n["name"], n["op"]) for n in inner if n["op"] != "null"]
            heads = subgraphs[0].get("heads") or [[len(inner) - 1, 0, 0]]
            head = inner[heads[0][0]]["name"]
        else:
            name = node["name"].removeprefix(QUANTIZED_PREFIX)
            op_type = _fp32_op_type(node["op"])
            members, head = [(name, op_type)], name
        found.append(Group(node["name"], node["op"], members, head, node.get("attrs", {}), inputs))
    return found


def tunable_ops(graph: dict[str, Any]) -> list[tuple[str, str]]:
    """The ops lpq tunes, as ``(name, op_type)`` in graph order, read from the fused
    (or quantized) graph: one per fusion group with a Convolution / FullyConnected, plus
    the Pooling / Flatten / Concat / elemwise_add nodes that stand on their own."""
    return [g.anchor for g in groups(graph) if g.anchor is not None]


def group_of(graph_groups: list[Group], op_name: str) -> Group | None:
    """The group that runs fp32 op ``op_name``."""
    for group in graph_groups:
        if any(name == op_name for name, _ in group.members):
            return group
    return None


def fused_types(graph: dict[str, Any]) -> list[tuple[str, ...]]:
    """The op-type sequences oneDNN fused in this graph, one per fused group."""
    return [tuple(t for _, t in g.members) for g in groups(graph) if len(g.members) > 1]


def is_quantized(graph: dict[str, Any]) -> bool:
    """True when the graph already holds quantized ops (an int8 model, not an fp32 one)."""
    return any(
        n["op"].startswith(("_contrib_quantize", "_contrib_quantized_", "_contrib_requantize"))
        or n.get("attrs", {}).get("quantized", "").lower() == "true"
        for n in graph["nodes"]
    )


def _fp32_op_type(op: str) -> str:
    """``_contrib_quantized_pooling`` -> ``Pooling``: the fp32 type of a quantized node."""
    if not op.startswith("_contrib_quantized_"):
        return op
    base = op.removeprefix("_contrib_quantized_")
    return {
        "pooling": "Pooling",
        "flatten": "Flatten",
        "concat": "Concat",
        "elemwise_add": "elemwise_add",
        "conv": "Convolution",
        "fully_connected": "FullyConnected",
    }.get(base, base)
