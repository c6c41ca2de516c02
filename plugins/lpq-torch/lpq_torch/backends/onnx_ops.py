"""ATen op -> ONNX nodes, one translation per op (a registry: adding an op is one function).

Each translation receives the emitter, the fx node, its arguments normalized to keywords
(defaults filled in from the op's schema) and the ONNX node name, and emits the ONNX
nodes whose final output is named after the fx node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lpq import ModelError

from . import simulate

if TYPE_CHECKING:
    from .onnx_export import Emitter


Translation = Callable[["Emitter", torch.fx.Node, dict[str, Any], str], None]
TRANSLATIONS: dict[str, Translation] = {}


def _register(*kinds: str) -> Callable[[Translation], Translation]:
    def decorate(func: Translation) -> Translation:
        for kind in kinds:
            TRANSLATIONS[kind] = func
        return func

    return decorate


def _ints(value: Any, count: int) -> list[int]:
    values = list(value) if isinstance(value, list | tuple) else [value]
    if len(values) == 1 and count > 1:
        values = values * count
    return [int(v) for v in values]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


@_register("conv1d", "conv2d")
def _conv(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    weight = kw["weight"]
    spatial = e.rank(weight) - 2 if isinstance(weight, torch.fx.Node) else 2
    inputs = [e.value(kw["input"]), e.value(weight)]
    if kw.get("bias") is not None:
        inputs.append(e.value(kw["bias"]))
    attrs: dict[str, Any] = {
        "strides": _ints(kw.get("stride", 1), spatial),
        "dilations": _ints(kw.get("dilation", 1), spatial),
        "group": int(kw.get("groups", 1)),
    }
    padding = kw.get("padding", 0)
    if padding == "same":
        attrs["auto_pad"] = "SAME_UPPER"
    elif padding != "valid":
        attrs["pads"] = _ints(padding, spatial) * 2
    e.emit("Conv", inputs, [node.name], name, **attrs)


@_register("linear")
def _linear(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    x, weight = e.value(kw["input"]), e.value(kw["weight"])
    bias = e.value(kw["bias"]) if kw.get("bias") is not None else None
    if e.rank(kw["input"]) == 2:
        e.emit("Gemm", [x, weight, *([bias] if bias else [])], [node.name], name, transB=1)
        return
    transposed = e.fresh(f"{weight}_transposed")
    e.emit("Transpose", [weight], [transposed], transposed, perm=[1, 0])
    product = e.fresh(f"{node.name}_matmul") if bias else node.name
    e.emit("MatMul", [x, transposed], [product], name)
    if bias:
        e.emit("Add", [product, bias], [node.name], f"{name}_bias")


@_register("matmul", "mm", "bmm")
def _matmul(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    a = kw.get("input", kw.get("self"))
    e.emit("MatMul", [e.value(a), e.value(kw.get("other", kw.get("mat2")))], [node.name], name)


def _unary(op_type: str, **attrs: Any) -> Translation:
    def translate(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
        source = kw.get("input", kw.get("self"))
        e.emit(op_type, [e.value(source)], [node.name], name, **attrs)

    return translate


for _kind, _op in (
    ("relu", "Relu"),
    ("relu_", "Relu"),
    ("sigmoid", "Sigmoid"),
    ("tanh", "Tanh"),
    ("hardswish", "HardSwish"),
    ("hardswish_", "HardSwish"),
    ("dropout", "Identity"),
    ("clone", "Identity"),
    ("contiguous", "Identity"),
    ("alias", "Identity"),
    ("detach", "Identity"),
):
    TRANSLATIONS[_kind] = _unary(_op)
TRANSLATIONS["hardsigmoid"] = _unary("HardSigmoid", alpha=1 / 6, beta=0.5)


@_register("hardtanh", "hardtanh_", "clamp", "clip")
def _clip(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    low = kw.get("min_val", kw.get("min", -1.0 if "hardtanh" in str(node.target) else None))
    high = kw.get("max_val", kw.get("max", 1.0 if "hardtanh" in str(node.target) else None))
    inputs = [e.value(source)]
    inputs.append(e.const(float(low)) if low is not None else "")
    inputs.append(e.const(float(high)) if high is not None else "")
    e.emit("Clip", inputs, [node.name], name)


def _binary(op_type: str) -> Translation:
    def translate(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
        other = e.value(kw["other"])
        alpha = kw.get("alpha", 1)
        if alpha not in (None, 1):
            scaled = e.fresh(f"{node.name}_alpha")
            e.emit("Mul", [other, e.const(float(alpha))], [scaled], scaled)
            other = scaled
        e.emit(op_type, [e.value(kw.get("input", kw.get("self"))), other], [node.name], name)

    return translate


for _kind, _op in (("add", "Add"), ("add_", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div")):
    TRANSLATIONS[_kind] = _binary(_op)


def _pool_attributes(kw: dict[str, Any], spatial: int) -> dict[str, Any]:
    """ONNX attributes every pooling op shares, from torch's pooling arguments."""
    kernel = _ints(kw["kernel_size"], spatial)
    return {
        "kernel_shape": kernel,
        "strides": _ints(kw.get("stride") or kernel, spatial),
        "pads": _ints(kw.get("padding", 0), spatial) * 2,
        "ceil_mode": int(bool(kw.get("ceil_mode", False))),
    }


@_register("max_pool1d", "max_pool2d")
def _max_pool(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    spatial = e.rank(kw["input"]) - 2
    e.emit(
        "MaxPool",
        [e.value(kw["input"])],
        [node.name],
        name,
        **_pool_attributes(kw, spatial),
        dilations=_ints(kw.get("dilation", 1), spatial),
    )


@_register("avg_pool1d", "avg_pool2d")
def _avg_pool(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    if kw.get("divisor_override") is not None:
        raise ModelError(f"{node.name}: avg_pool with divisor_override has no ONNX equivalent")
    e.emit(
        "AveragePool",
        [e.value(kw["input"])],
        [node.name],
        name,
        **_pool_attributes(kw, e.rank(kw["input"]) - 2),
        count_include_pad=int(bool(kw.get("count_include_pad", True))),
    )


@_register("adaptive_avg_pool1d", "adaptive_avg_pool2d")
def _adaptive_avg_pool(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    size = _ints(kw["output_size"], e.rank(kw["input"]) - 2)
    if any(s != 1 for s in size):
        raise ModelError(
            f"{node.name}: adaptive average pooling to {size} has no ONNX equivalent",
            hint="pool to 1 (global average pooling), or use avg_pool2d",
        )
    e.emit("GlobalAveragePool", [e.value(kw["input"])], [node.name], name)


@_register("mean")
def _mean(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    rank = e.rank(source)
    axes = [_axis(int(a), rank) for a in _ints(kw.get("dim") or list(range(rank)), 1)]
    keep = int(bool(kw.get("keepdim", False)))
    if e.opset >= 18:
        e.emit(
            "ReduceMean",
            [e.value(source), e.const(axes, np.int64)],
            [node.name],
            name,
            keepdims=keep,
        )
    else:
        e.emit("ReduceMean", [e.value(source)], [node.name], name, axes=axes, keepdims=keep)


def _reshape_to(e: Emitter, node: torch.fx.Node, source: Any, shape: list[Any], name: str) -> None:
    dims: list[int] = []
    for index, dim in enumerate(shape):
        if isinstance(dim, int):
            dims.append(dim)
        elif index == 0:
            dims.append(0)  # the (dynamic) batch dimension: copy it from the input
        elif -1 not in dims:
            dims.append(-1)
        else:
            raise ModelError(f"{node.name}: a reshape with two dynamic sizes cannot be exported")
    e.emit("Reshape", [e.value(source), e.const(dims, np.int64)], [node.name], name)


@_register("view", "reshape", "_unsafe_view")
def _view(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    size = kw.get("size", kw.get("shape"))
    assert size is not None
    _reshape_to(e, node, kw.get("self", kw.get("input")), list(size), name)


@_register("flatten")
def _flatten(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    rank = e.rank(source)
    start = _axis(int(kw.get("start_dim", 0)), rank)
    end = _axis(int(kw.get("end_dim", -1)), rank)
    if start == 1 and end == rank - 1:
        e.emit("Flatten", [e.value(source)], [node.name], name, axis=1)
        return
    assert isinstance(source, torch.fx.Node)
    tail = [int(d) for d in source.meta["val"].shape[end + 1 :]]
    shape: list[Any] = [0] * start + [-1] + tail
    e.emit("Reshape", [e.value(source), e.const(shape, np.int64)], [node.name], name)


@_register("cat", "concat")
def _cat(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    tensors = list(kw["tensors"])
    axis = _axis(int(kw.get("dim", 0)), e.rank(tensors[0]))
    e.emit("Concat", [e.value(t) for t in tensors], [node.name], name, axis=axis)


@_register("permute")
def _permute(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    rank = e.rank(source)
    perm = [_axis(int(d), rank) for d in kw["dims"]]
    e.emit("Transpose", [e.value(source)], [node.name], name, perm=perm)


@_register("transpose")
def _transpose(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    rank = e.rank(source)
    perm = list(range(rank))
    a, b = _axis(int(kw["dim0"]), rank), _axis(int(kw["dim1"]), rank)
    perm[a], perm[b] = perm[b], perm[a]
    e.emit("Transpose", [e.value(source)], [node.name], name, perm=perm)


@_register("chunk", "split", "split_with_sizes", "unbind")
def _split(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("input", kw.get("self"))
    axis = _axis(int(kw.get("dim", 0)), e.rank(source))
    parts = node.meta["val"]
    sizes = [int(part.shape[axis]) if part.dim() == e.rank(source) else 1 for part in parts]
    outputs = [f"{node.name}_{i}" for i in range(len(parts))]
    if simulate.short_name(node) == "unbind":
        split = [f"{o}_kept" for o in outputs]
        e.emit("Split", [e.value(source), e.const(sizes, np.int64)], split, name, axis=axis)
        for kept, output in zip(split, outputs, strict=True):
            axes = e.const([axis], np.int64)
            e.emit("Squeeze", [kept, axes], [output], f"{output}_squeeze")
        return
    e.emit("Split", [e.value(source), e.const(sizes, np.int64)], outputs, name, axis=axis)


@_register("softmax", "_softmax")
def _softmax(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    axis = _axis(int(kw["dim"]), e.rank(source))
    e.emit("Softmax", [e.value(source)], [node.name], name, axis=axis)


@_register("silu", "silu_")
def _silu(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = e.value(kw.get("input", kw.get("self")))
    gate = e.fresh(f"{node.name}_sigmoid")
    e.emit("Sigmoid", [source], [gate], gate)
    e.emit("Mul", [source, gate], [node.name], name)


@_register("gelu")
def _gelu(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    if kw.get("approximate", "none") != "none":
        raise ModelError(f"{node.name}: the tanh-approximated GELU is not exported yet")
    x = e.value(kw.get("self", kw.get("input")))
    scaled, erf, one, half = (e.fresh(f"{node.name}_{p}") for p in ("div", "erf", "add", "mul"))
    e.emit("Div", [x, e.const(math.sqrt(2.0))], [scaled], scaled)
    e.emit("Erf", [scaled], [erf], erf)
    e.emit("Add", [erf, e.const(1.0)], [one], one)
    e.emit("Mul", [x, one], [half], half)
    e.emit("Mul", [half, e.const(0.5)], [node.name], name)


@_register("batch_norm")
def _batch_norm(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    inputs = [e.value(kw[k]) for k in ("input", "weight", "bias", "running_mean", "running_var")]
    e.emit("BatchNormalization", inputs, [node.name], name, epsilon=float(kw.get("eps", 1e-5)))


@_register("layer_norm")
def _layer_norm(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    axis = -len(list(kw["normalized_shape"]))
    inputs = [e.value(kw["input"]), e.value(kw["weight"])]
    if kw.get("bias") is not None:
        inputs.append(e.value(kw["bias"]))
    e.emit(
        "LayerNormalization",
        inputs,
        [node.name],
        name,
        axis=axis,
        epsilon=float(kw.get("eps", 1e-5)),
    )


@_register("unsqueeze", "squeeze")
def _squeeze(e: Emitter, node: torch.fx.Node, kw: dict[str, Any], name: str) -> None:
    source = kw.get("self", kw.get("input"))
    kind = simulate.short_name(node)
    rank = e.rank(node) if kind == "unsqueeze" else e.rank(source)
    dims = kw.get("dim")
    inputs = [e.value(source)]
    if dims is not None:
        inputs.append(e.const([_axis(int(d), rank) for d in _ints(dims, 1)], np.int64))
    e.emit("Unsqueeze" if kind == "unsqueeze" else "Squeeze", inputs, [node.name], name)
