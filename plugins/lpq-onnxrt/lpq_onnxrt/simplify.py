"""Exact fp32 rewrites that ORT's optimizer misses and that int8 pays for many times over.

Models exported from Paddle (PP-OCR's PPLCNetV3 backbone) and other mobile nets carry
"learnable affine" blocks (a constant ``Mul`` then a constant ``Add`` after a conv) and a
HardSwish spelled out as ``Add(3) -> Clip(0, 6) -> Mul(x) -> Div(6)``. In fp32 these are
cheap; in int8 every float op between quantized convs costs a DequantizeLinear and a
QuantizeLinear (or forces a slow QLinearMul/QLinearAdd), which is why ORT's quantizer
gains little on such models. Rewritten before calibration:

- ``Conv -> Mul(c) -> Add(d)`` (``c``, ``d`` scalars or per-output-channel constants, the
  conv output used once) becomes one Conv with weights ``W * c`` and bias ``b * c + d``;
- the spelled-out HardSwish becomes ``HardSigmoid(alpha=1/6, beta=0.5)`` times ``x``
  (two ops instead of four; ``HardSwish`` itself needs opset 14).

Both are exact in real arithmetic (fp32 rounding differs in the last bits). They run once
when a model is prepared (:func:`lpq_onnxrt.model_io.prepare`), so the capability, the
tune_cfg and calibration all see the simplified graph; names of surviving nodes are kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx


def simplify(model: onnx.ModelProto) -> int:
    """Apply the rewrites in place until none applies; return how many were made."""
    total = 0
    while True:
        made = _fold_affine_into_conv(model) + _fuse_hardswish(model)
        if not made:
            return total
        total += made


class _Graph:
    """Indexes of one graph: producers, consumers, constants."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from onnx import numpy_helper

        self.model = model
        graph = model.graph
        self.inits = {init.name: init for init in graph.initializer}
        self.values: dict[str, np.ndarray] = {}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self.values[node.output[0]] = numpy_helper.to_array(attr.t)
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {out.name for out in graph.output}

    def const(self, name: str) -> np.ndarray | None:
        if name in self.inits:
            from onnx import numpy_helper

            return numpy_helper.to_array(self.inits[name])
        return self.values.get(name)

    def only_user(self, tensor: str) -> onnx.NodeProto | None:
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or tensor in self.outputs:
            return None
        return users[0]

    def other_input(self, node: onnx.NodeProto, tensor: str) -> str | None:
        if len(node.input) != 2:
            return None
        a, b = node.input
        if a == tensor:
            return str(b)
        if b == tensor:
            return str(a)
        return None


def _channel_vector(value: np.ndarray | None, channels: int) -> np.ndarray | None:
    """``value`` as one number per output channel, if it broadcasts that way on NCHW."""
    if value is None or value.dtype != np.float32:
        return None
    if value.size == 1:
        return np.full(channels, float(value.reshape(-1)[0]), np.float32)
    squeezed = value.reshape(-1)
    if squeezed.size != channels:
        return None
    shape = value.shape
    # (C, 1, 1) or (1, C, 1, 1): channel axis is the third from last.
    if len(shape) >= 3 and shape[-3] == channels and int(np.prod(shape[-2:])) == 1:
        return squeezed.astype(np.float32)
    return None


def _replace_initializer(model: onnx.ModelProto, name: str, value: np.ndarray, used: int) -> str:
    """Set initializer ``name`` to ``value`` (a fresh name if others read it too)."""
    from onnx import numpy_helper

    graph = model.graph
    if used == 1:
        for index, init in enumerate(graph.initializer):
            if init.name == name:
                graph.initializer[index].CopyFrom(numpy_helper.from_array(value, name))
                return name
    fresh = f"{name}__lpq_folded_{len(graph.initializer)}"
    graph.initializer.append(numpy_helper.from_array(value, fresh))
    return fresh


def _fold_affine_into_conv(model: onnx.ModelProto) -> int:
    g = _Graph(model)
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    folded = 0
    removed: set[int] = set()
    for conv in list(model.graph.node):
        if conv.op_type != "Conv" or len(conv.input) < 2 or conv.input[1] not in g.inits:
            continue
        weight = g.const(conv.input[1])
        if weight is None or weight.dtype != np.float32:
            continue
        channels = weight.shape[0]
        tensor = conv.output[0]
        scale = np.ones(channels, np.float32)
        shift = np.zeros(channels, np.float32)
        chain: list[onnx.NodeProto] = []
        user = g.only_user(tensor)
        while user is not None and user.op_type in ("Mul", "Add") and len(chain) < 4:
            other = g.other_input(user, tensor)
            vector = _channel_vector(g.const(other), channels) if other else None
            if vector is None:
                break
            if user.op_type == "Mul":
                scale, shift = scale * vector, shift * vector
            else:
                shift = shift + vector
            chain.append(user)
            tensor = user.output[0]
            user = g.only_user(tensor)
        if not chain or any(id(node) in removed for node in chain):
            continue
        bias = (
            g.const(conv.input[2])
            if len(conv.input) > 2 and conv.input[2]
            else np.zeros(channels, np.float32)
        )
        if bias is None:
            continue
        shape = [channels] + [1] * (weight.ndim - 1)
        new_weight = (weight * scale.reshape(shape)).astype(np.float32)
        new_bias = (bias * scale + shift).astype(np.float32)
        conv.input[1] = _replace_initializer(model, conv.input[1], new_weight, uses[conv.input[1]])
        if len(conv.input) > 2 and conv.input[2]:
            conv.input[2] = _replace_initializer(
                model, conv.input[2], new_bias, uses[conv.input[2]]
            )
        else:
            from onnx import numpy_helper

            name = f"{conv.name}__lpq_bias"
            model.graph.initializer.append(numpy_helper.from_array(new_bias, name))
            conv.input.append(name)
        # The conv now writes the chain's last tensor; the chain goes.
        conv.output[0] = chain[-1].output[0]
        for node in chain:
            removed.add(id(node))
        folded += 1
    if removed:
        kept = [node for node in model.graph.node if id(node) not in removed]
        del model.graph.node[:]
        model.graph.node.extend(kept)
        _drop_unused_initializers(model)
    return folded


def _is_scalar(value: np.ndarray | None, expected: float) -> bool:
    return (
        value is not None and value.size == 1 and abs(float(value.reshape(-1)[0]) - expected) < 1e-6
    )


def _fuse_hardswish(model: onnx.ModelProto) -> int:
    """``x * Clip(x + 3, 0, 6) / 6`` -> ``x * HardSigmoid(x)`` (alpha 1/6, beta 1/2)."""
    from onnx import helper

    g = _Graph(model)
    fused = 0
    removed: set[int] = set()
    additions: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []
    for add in list(model.graph.node):
        if add.op_type != "Add" or len(add.input) != 2 or id(add) in removed:
            continue
        x = next((t for t in add.input if not _is_scalar(g.const(t), 3.0)), None)
        three = g.other_input(add, x) if x is not None else None
        if x is None or three is None or not _is_scalar(g.const(three), 3.0):
            continue
        clip = g.only_user(add.output[0])
        if clip is None or clip.op_type != "Clip" or len(clip.input) < 3:
            continue
        if not (
            _is_scalar(g.const(clip.input[1]), 0.0) and _is_scalar(g.const(clip.input[2]), 6.0)
        ):
            continue
        mul = g.only_user(clip.output[0])
        if mul is None or mul.op_type != "Mul" or g.other_input(mul, clip.output[0]) != x:
            continue
        div = g.only_user(mul.output[0])
        if div is None:
            continue
        if (
            div.op_type == "Div"
            and div.input[0] == mul.output[0]
            and _is_scalar(g.const(div.input[1]), 6.0)
        ) or (
            div.op_type == "Mul"
            and _is_scalar(g.const(g.other_input(div, mul.output[0]) or ""), 1.0 / 6.0)
        ):
            pass
        else:
            continue
        gate = f"{add.name}__lpq_hardsigmoid"
        sigmoid = helper.make_node("HardSigmoid", [x], [gate], name=gate, alpha=1.0 / 6.0, beta=0.5)
        product = helper.make_node("Mul", [x, gate], [div.output[0]], name=mul.name)
        for node in (add, clip, mul, div):
            removed.add(id(node))
        additions.append((add, sigmoid))
        additions.append((add, product))
        fused += 1
    if fused:
        new_nodes: list[onnx.NodeProto] = []
        pending: dict[int, list[onnx.NodeProto]] = {}
        for anchor, node in additions:
            pending.setdefault(id(anchor), []).append(node)
        for node in model.graph.node:
            if id(node) in pending:
                new_nodes.extend(pending[id(node)])
            if id(node) not in removed:
                new_nodes.append(node)
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
        _drop_unused_initializers(model)
    return fused


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    from .graph import graph_reads

    graph = model.graph
    used = graph_reads(graph)
    for init in [init for init in graph.initializer if init.name not in used]:
        graph.initializer.remove(init)
    kept = [
        vi
        for vi in graph.value_info
        if vi.name in used or vi.name in {o for n in graph.node for o in n.output}
    ]
    del graph.value_info[:]
    graph.value_info.extend(kept)
