"""lpq_quantized_ops: the precision each op really runs in, read from the converted model.

Never from the tune_cfg: torchao's recipe can silently leave an op in float (a pattern it
does not match), and lpq must report that op as fp32. For a PT2E graph an op is quantized
when a ``dequantize`` node feeds its weight or its input; the bit width comes from that
node's ``quant_min``/``quant_max`` (int4 is simulated in an int8 container, see
:mod:`lpq_torch.qspec`). An op whose inputs are cast to bf16/fp16 runs in that dtype. For
a model from torchao's dynamic path an op is int8 when its ``nn.Linear`` weight really is
a torchao quantized tensor. A model simulating a backend scheme is read from its
quantizers (:func:`lpq_torch.backends.simulate.quantized_ops`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import graph, model_io
from .backends import simulate
from .info import DYNAMIC_ATTR, WEIGHT_ONLY_ATTR

_LOW_FLOAT = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def quantized_ops(model: Any) -> dict[str, str]:
    """fp32 op name -> ``int8``/``int4``/.../``bf16``/``fp16``/``fp32`` for every op."""
    if simulate.is_simulated(model):
        return simulate.quantized_ops(model)
    module = model_io.require_module(model)
    if hasattr(module, DYNAMIC_ATTR):
        return _dynamic_ops(module)
    if hasattr(module, WEIGHT_ONLY_ATTR):
        return weight_only_ops(module)
    if isinstance(module, torch.fx.GraphModule) and any(graph.quantizable_nodes(module)):
        return {key[0]: node_precision(node) for key, node in graph.quantizable_nodes(module)}
    example = model_io.example_for(module)
    if example is None:
        return {}
    fp32 = model_io.exported(module, example, copy_graph=False)
    return {key[0]: "fp32" for key, _ in graph.quantizable_nodes(fp32)}


def _dynamic_ops(module: torch.nn.Module) -> dict[str, str]:
    int8 = quantized_linears(module)
    names: list[str] = getattr(module, DYNAMIC_ATTR)
    return {name: "int8" if name in int8 else "fp32" for name in names}


def weight_only_ops(module: torch.nn.Module) -> dict[str, str]:
    """Every op of a weight-only model's tune_cfg: int4/int8 when its Linear's weight
    really is torchao's int4 (``Int4OpaqueTensor``) or int8 (``Int8Tensor``) tensor."""
    names: list[str] = getattr(module, WEIGHT_ONLY_ATTR).ops
    found = dict(module.named_modules())
    return {name: linear_weight_precision(found.get(name)) for name in names}


def linear_weight_precision(sub: torch.nn.Module | None) -> str:
    """``int4``/``int8`` from the type of a Linear's weight tensor, else ``fp32``/``bf16``."""
    weight = getattr(sub, "weight", None)
    if not isinstance(sub, torch.nn.Linear) or weight is None:
        return "fp32"
    tensor = weight.data if isinstance(weight, torch.nn.Parameter) else weight
    kind = type(tensor).__name__
    if "torchao" in type(tensor).__module__:
        if kind.startswith("Int4"):
            return "int4"
        if kind.startswith("Int8"):
            return "int8"
    return _LOW_FLOAT.get(tensor.dtype, "fp32")


def quantized_linears(model: torch.nn.Module) -> set[str]:
    """Module paths whose weight really is a torchao quantized tensor (read from the model)."""
    found: set[str] = set()
    for name, sub in model.named_modules():
        weight = getattr(sub, "weight", None)
        if isinstance(sub, torch.nn.Linear) and weight is not None:
            tensor = weight.data if isinstance(weight, torch.nn.Parameter) else weight
            if type(tensor) is not torch.Tensor and "torchao" in type(tensor).__module__:
                found.add(name)
    return found


def node_precision(node: torch.fx.Node) -> str:
    """What one conv/linear/matmul node of a converted graph computes in."""
    bits = [b for arg in node.args[:2] if (b := _dequantized_bits(arg)) is not None]
    if bits:
        return f"int{max(bits)}"
    for arg in node.args[:2]:
        if isinstance(arg, torch.fx.Node) and arg.target == torch.ops.aten._to_copy.default:
            dtype = arg.kwargs.get("dtype")
            low = _LOW_FLOAT.get(dtype) if isinstance(dtype, torch.dtype) else None
            if low is not None:
                return low
    return "fp32"


def _dequantized_bits(arg: Any) -> int | None:
    if not isinstance(arg, torch.fx.Node) or "dequantize" not in str(arg.target):
        return None
    ints = [a for a in arg.args[1:] if isinstance(a, int) and not isinstance(a, bool)]
    if len(ints) < 2:
        return 8
    qmin, qmax = ints[-2], ints[-1]
    return max(1, math.ceil(math.log2(qmax - qmin + 1)))
