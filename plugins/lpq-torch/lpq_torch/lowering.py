"""Rewrites of a converted PT2E graph so Inductor (freezing) lowers it correctly to int8.

**int8 conv1d.** Inductor 2.13 lowers ``dequantize -> aten.conv1d`` to a oneDNN int8
convolution but drops the 1-D stride on the way: a quantized ``Conv1d(stride=2)`` compiled
with freezing returns stride-1 shapes (``shape '[8, 16]' is invalid for input of size
256``). On Silero VAD (the STFT conv has stride 128) that surfaced as a broadcast error in
the LSTM cell after it, freezing was abandoned and the unfrozen int8 graph never reached
int8 kernels (0.30x of fp32). Int8 *conv2d* is lowered correctly, so each quantized conv1d
is rewritten as the conv2d it is, in the converted model itself (so a user who compiles
lpq's model gets correct int8 kernels too): the uint8 input and the int8 weight get a trailing unit
dimension (the weight as a new constant, so the ``dequantize -> conv`` pattern Inductor
matches stays intact), stride/padding/dilation get a second entry (1, 0, 1), and the
trailing dimension is squeezed away after the conv's fused tail (``relu``, the next
``quantize``), so conv + relu + requantize still become one kernel. The arithmetic is the
same (the outputs are bit-identical eagerly). The node keeps its lpq op name and type
(``conv1d``) and is marked (:data:`AS_CONV2D` in ``meta["custom"]``, which ``torch.export``
saves), so inspection and ``set_tensor`` show and take 3-D tensors as before.
"""

from __future__ import annotations

from typing import Any

import torch

# By name: the quantized_decomposed ops exist only once torchao is imported.
_DEQUANT = {
    "quantized_decomposed.dequantize_per_tensor.default",
    "quantized_decomposed.dequantize_per_channel.default",
}
_TAIL = {"aten.relu.default", "quantized_decomposed.quantize_per_tensor.default"}


def _quantized_conv1d(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target != torch.ops.aten.conv1d.default:
        return False
    x, w = node.args[0], node.args[1]
    return (
        isinstance(x, torch.fx.Node)
        and str(x.target) in _DEQUANT
        and isinstance(w, torch.fx.Node)
        and str(w.target) in _DEQUANT
        and isinstance(w.args[0], torch.fx.Node)
        and w.args[0].op == "get_attr"
    )


#: ``meta["custom"]`` flag of a conv2d node that computes an fp32 model's conv1d.
AS_CONV2D = "lpq_conv1d_as_conv2d"


def conv1d_as_conv2d(gm: torch.fx.GraphModule) -> None:
    """Rewrite every quantized conv1d of a converted graph as a conv2d, in place."""
    nodes = [n for n in gm.graph.nodes if _quantized_conv1d(n)]
    for node in nodes:
        _as_conv2d(gm, node)
    if nodes:
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        gm.recompile()


def is_conv1d_as_conv2d(node: torch.fx.Node) -> bool:
    return bool((node.meta.get("custom") or {}).get(AS_CONV2D))


def _as_conv2d(gm: torch.fx.GraphModule, conv: torch.fx.Node) -> None:
    graph = gm.graph
    dq_x, dq_w = conv.args[0], conv.args[1]
    assert isinstance(dq_x, torch.fx.Node) and isinstance(dq_w, torch.fx.Node)
    w_attr = dq_w.args[0]
    assert isinstance(w_attr, torch.fx.Node)
    weight = attribute(gm, str(w_attr.target))
    name = f"{str(w_attr.target).replace('.', '_')}_as_conv2d"
    gm.register_buffer(name, weight.unsqueeze(-1).contiguous())
    args = list(conv.args) + [None] * (7 - len(conv.args))
    bias, stride, padding, dilation, groups = args[2:7]
    with graph.inserting_before(conv):
        x4 = graph.call_function(torch.ops.aten.unsqueeze.default, (dq_x.args[0], -1))
        dq_x4 = graph.call_function(dq_x.target, (x4, *dq_x.args[1:]), dict(dq_x.kwargs))  # type: ignore[arg-type]
        w4 = graph.get_attr(name)
        dq_w4 = graph.call_function(dq_w.target, (w4, *dq_w.args[1:]), dict(dq_w.kwargs))  # type: ignore[arg-type]
        conv2d = graph.call_function(
            torch.ops.aten.conv2d.default,
            (
                dq_x4,
                dq_w4,
                bias,
                [*_pair(stride, 1)],
                [*_pair(padding, 0)],
                [*_pair(dilation, 1)],
                1 if groups is None else groups,
            ),
        )
    conv2d.meta.update({k: v for k, v in conv.meta.items() if k not in ("val", "custom")})
    conv2d.meta["custom"] = {**(conv.meta.get("custom") or {}), AS_CONV2D: True}
    # Squeeze after the fused tail: conv -> relu -> quantize stays one int8 kernel.
    last_old, last_new = conv, conv2d
    while len(last_old.users) == 1:
        user = next(iter(last_old.users))
        if str(user.target) not in _TAIL or user.args[0] is not last_old:
            break
        with graph.inserting_after(last_new):
            new = graph.call_function(user.target, (last_new, *user.args[1:]), dict(user.kwargs))  # type: ignore[arg-type]
        last_old, last_new = user, new
    with graph.inserting_after(last_new):
        squeezed = graph.call_function(torch.ops.aten.squeeze.dim, (last_new, -1))
    last_old.replace_all_uses_with(squeezed)


def attribute(gm: torch.nn.Module, target: str) -> Any:
    """The tensor a ``get_attr`` node reads (a dotted path)."""
    owner, _, leaf = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, leaf)


def _pair(value: Any, filler: int) -> tuple[int, int]:
    if value is None:
        return (1 if filler == 1 else 0, filler)
    items = list(value) if isinstance(value, list | tuple) else [value]
    return (int(items[0]), filler)
