"""Editing models after quantization: the optional hooks ``lpq_set_tensor`` and
``lpq_quantize_input``.

``set_tensor`` writes a weight or bias, named as inspection names it (``<op>.weight``,
``<op>.bias``; for an ``nn.Module`` op that is the parameter's qualified name), into a copy
of the model: for an fp32 ``nn.Module`` the parameter itself; for a converted PT2E graph
the stored tensor behind the op's input: a float bias is replaced, an int8 weight is
re-quantized with its existing scale and zero point (per channel or per tensor), so
core-side algorithms such as bias correction work on quantized models too.

``quantize_input`` gives a converted graph integer inputs and outputs. Each input's first
``quantize_per_tensor`` is removed, so the caller feeds the integers (uint8 from torch's x86
recipe); every other reader of the input gets the dequantized value. An output computed by
a ``dequantize`` returns its integers; a float output is quantized with the range observed
during calibration. Scales and zero points are in ``model._lpq_io`` (also saved in the
``.pt2``): ``{"input:<name>" | "output:<i>": {"scale", "zero_point", "dtype", "quant_min",
"quant_max"}}``; ``real = (int - zero_point) * scale``.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from lpq import ConfigError, ModelError

from . import graph, lowering, model_io
from .graph import weight_args
from .info import DYNAMIC_ATTR, EXAMPLE_ATTR, IO_ATTR, OUTPUT_RANGES_ATTR, TUNE_CFG_ATTR
from .model_io import require_module

_QUANT = "quantized_decomposed.quantize_per_tensor.default"
_DEQUANT_TENSOR = "quantized_decomposed.dequantize_per_tensor.default"
_DEQUANT_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
#: Readers of an integer input that need no float value.
_READERS = {_DEQUANT_TENSOR, "aten.sym_size.int"}
_DTYPES = {"uint8": torch.uint8, "int8": torch.int8}


def _copy(module: torch.nn.Module) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own pytree deprecation, from deepcopy
        return copy.deepcopy(module)


def _is_graph(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.fx.GraphModule) and any(graph.quantizable_nodes(module))


# ------------------------------------------------------------------------ set_tensor


def set_tensor(model: Any, tensor_name: str, value: Any) -> torch.nn.Module:
    """A copy of ``model`` with ``tensor_name`` set to ``value`` (see the module doc)."""
    module = require_module(model)
    if hasattr(module, DYNAMIC_ATTR):
        raise ModelError(
            "set_tensor cannot write into a model from torchao's dynamic int8 path (its "
            "weights are torchao tensor subclasses)",
            hint="set the tensor on the fp32 model, then quantize it again",
        )
    new = torch.as_tensor(np.asarray(value))
    if _is_graph(module):
        edited = _copy(module)
        _write(edited, _stored_input(edited, tensor_name), tensor_name, new)
        return edited
    target = _parameter_path(module, tensor_name)
    edited = _copy(module)
    _replace_attribute(edited, target, tensor_name, new)
    return edited


def _split(tensor_name: str) -> tuple[str, str]:
    op, _, label = tensor_name.rpartition(".")
    return op, label


def _ops(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    return {key[0]: node for key, node in graph.quantizable_nodes(gm)}


def _unknown(tensor_name: str, nodes: dict[str, torch.fx.Node]) -> ModelError:
    known = [f"{op}.{label}" for op, node in nodes.items() for label in weight_args(node)]
    return ModelError(
        f"the model has no weight or bias tensor named {tensor_name!r}",
        hint="name one as lpq_inspect_tensor does (<op name>.weight / .bias): "
        + (", ".join(known[:12]) or "none"),
    )


def _stored_input(gm: torch.fx.GraphModule, tensor_name: str) -> torch.fx.Node:
    """The node feeding op ``<op>``'s weight/bias, through casts (bf16 ops)."""
    nodes = _ops(gm)
    op, label = _split(tensor_name)
    arg = weight_args(nodes[op]).get(label) if op in nodes else None
    if arg is None:
        raise _unknown(tensor_name, nodes)
    while arg.target == torch.ops.aten._to_copy.default and isinstance(arg.args[0], torch.fx.Node):
        arg = arg.args[0]
    return arg


def _parameter_path(module: torch.nn.Module, tensor_name: str) -> str:
    """The qualified name of the parameter behind ``tensor_name`` in an fp32 module."""
    example = model_io.example_for(module)
    if example is None:
        names = dict([*module.named_parameters(), *module.named_buffers()])
        if tensor_name in names:  # an nn.Module op: the name is the parameter's
            return tensor_name
        raise ModelError(
            f"cannot find tensor {tensor_name!r} without the model's graph",
            hint="query the model's capability (or inspect it) with data first, so lpq "
            "has exported it",
        )
    gm = model_io.exported(module, example, copy_graph=False)
    arg = _stored_input(gm, tensor_name)
    if arg.op != "get_attr":
        raise ModelError(
            f"tensor {tensor_name!r} is computed in forward(), not stored in the model",
            hint="set the parameter it is computed from on the model itself",
        )
    return str(arg.target)


def _check_shape(tensor_name: str, expected: torch.Size, got: torch.Size) -> None:
    if tuple(expected) != tuple(got):
        raise ModelError(
            f"tensor {tensor_name!r} has shape {tuple(expected)}, the new value {tuple(got)}",
            hint="pass a value of the tensor's own shape",
        )


def _replace_attribute(
    module: torch.nn.Module, target: str, tensor_name: str, new: torch.Tensor
) -> None:
    current = lowering.attribute(module, target)
    _check_shape(tensor_name, current.shape, new.shape)
    with torch.no_grad():
        current.copy_(new.to(current.dtype))


def _write(gm: torch.fx.GraphModule, arg: torch.fx.Node, tensor_name: str, new: Any) -> None:
    if arg.op == "get_attr":
        _replace_attribute(gm, str(arg.target), tensor_name, new)
        return
    target = str(arg.target)
    stored = arg.args[0]
    if target not in (_DEQUANT_CHANNEL, _DEQUANT_TENSOR) or not (
        isinstance(stored, torch.fx.Node) and stored.op == "get_attr"
    ):
        raise ModelError(
            f"tensor {tensor_name!r} is computed in the graph, not stored",
            hint="set it on the fp32 model and quantize again",
        )
    ints = lowering.attribute(gm, str(stored.target))
    op_node = _ops(gm)[_split(tensor_name)[0]]
    if lowering.is_conv1d_as_conv2d(op_node) and new.dim() == ints.dim() - 1:
        new = new.unsqueeze(-1)  # lpq runs this conv1d as a conv2d
    _check_shape(tensor_name, ints.shape, new.shape)
    args: Any = arg.args
    scale, zero_point = (_constant(gm, a) for a in args[1:3])
    qmin, qmax = int(args[-3]), int(args[-2])
    if target == _DEQUANT_CHANNEL:
        shape = [1] * new.dim()
        shape[int(args[3])] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    q = torch.round(new.double() / scale.double()) + zero_point.double()
    with torch.no_grad():
        ints.copy_(q.clamp(qmin, qmax).to(ints.dtype))


def _constant(gm: torch.fx.GraphModule, arg: Any) -> torch.Tensor:
    if isinstance(arg, torch.fx.Node):
        return torch.as_tensor(lowering.attribute(gm, str(arg.target)))
    return torch.tensor(arg)


# ------------------------------------------------------------------------ quantize_input


def quantize_input(model: Any, options: dict[str, Any]) -> torch.fx.GraphModule:
    """A copy of a converted graph taking and returning integers (see the module doc)."""
    module = require_module(model)
    if not (hasattr(module, TUNE_CFG_ATTR) and _is_graph(module)):
        raise ModelError(
            "lpq_quantize_input needs a model from lpq's static int8 quantization (a "
            "converted PT2E graph)",
            hint="quantize it first (lpq.quantize with mode static), then make its inputs integer",
        )
    gm: torch.fx.GraphModule = _copy(module)
    io: dict[str, dict[str, Any]] = dict(getattr(module, IO_ATTR, {}))
    wanted = options.get("dtype")
    if wanted is not None and wanted not in _DTYPES:
        raise ConfigError(
            f"integer dtype {wanted!r} is not offered", hint=f"use one of {', '.join(_DTYPES)}"
        )
    example = model_io.example_for(module)
    if options.get("inputs", True):
        example = _integer_inputs(gm, io, wanted, example)
    if options.get("outputs", True):
        _integer_outputs(
            gm, io, _DTYPES[wanted or "uint8"], getattr(module, OUTPUT_RANGES_ATTR, [])
        )
    gm.graph.eliminate_dead_code()
    gm.recompile()
    setattr(gm, IO_ATTR, io)
    if example is not None:
        setattr(gm, EXAMPLE_ATTR, example)
    return gm


def _params(node: torch.fx.Node) -> dict[str, Any]:
    args: Any = node.args  # scalars, as convert_pt2e writes per-tensor parameters
    scale, zero_point, qmin, qmax, dtype = args[1:6]
    return {
        "scale": float(scale),
        "zero_point": int(zero_point),
        "quant_min": int(qmin),
        "quant_max": int(qmax),
        "dtype": str(dtype).replace("torch.", ""),
    }


def _integer_inputs(
    gm: torch.fx.GraphModule, io: dict[str, Any], wanted: str | None, example: Any
) -> Any:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    quantized: dict[int, dict[str, Any]] = {}
    for index, ph in enumerate(placeholders):
        quant = next((u for u in ph.users if str(u.target) == _QUANT and u.args[0] is ph), None)
        if quant is None:
            raise ModelError(
                f"input {ph.name!r} is not quantized right away in this model (its first op "
                "stays in float)",
                hint="pass options={'inputs': False} to keep float inputs",
            )
        params, quant_args = _params(quant), quant.args[1:6]
        if wanted is not None and params["dtype"] != wanted:
            raise ConfigError(
                f"input {ph.name!r} is quantized to {params['dtype']} in this model, not {wanted}",
                hint=f"pass dtype {params['dtype']!r} (or none)",
            )
        quant.replace_all_uses_with(ph)
        gm.graph.erase_node(quant)
        others = [u for u in ph.users if u.op != "call_module" and str(u.target) not in _READERS]
        if others:  # a float reader of the input gets the dequantized value
            with gm.graph.inserting_after(placeholders[-1]):
                dq = gm.graph.call_function(
                    torch.ops.quantized_decomposed.dequantize_per_tensor.default,
                    (ph, *quant_args),
                )
            for user in others:
                user.replace_input_with(ph, dq)
        _set_input_meta(ph, params["dtype"])
        io[f"input:{ph.name}"] = params
        quantized[index] = params
    _drop_input_guards(gm)
    return _quantized_example(example, quantized)


def _set_input_meta(ph: torch.fx.Node, dtype: str) -> None:
    val = ph.meta.get("val")
    if isinstance(val, torch.Tensor):
        with contextlib.suppress(Exception):
            ph.meta["val"] = val.to(_DTYPES[dtype])


def _drop_input_guards(gm: torch.fx.GraphModule) -> None:
    """The export's input guards check float inputs; the integer graph takes integers."""
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and str(node.target) == "_guards_fn":
            gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()
    for hook_id in list(gm._forward_pre_hooks):
        gm._forward_pre_hooks.pop(hook_id)


def _quantized_example(example: Any, params: dict[int, dict[str, Any]]) -> Any:
    if example is None:
        return None
    leaves, spec = pytree.tree_flatten(example)
    out = []
    for index, leaf in enumerate(leaves):
        p = params.get(index)
        if p is not None and isinstance(leaf, torch.Tensor):
            q = torch.round(leaf / p["scale"]) + p["zero_point"]
            leaf = q.clamp(p["quant_min"], p["quant_max"]).to(_DTYPES[p["dtype"]])
        out.append(leaf)
    return pytree.tree_unflatten(out, spec)


def _integer_outputs(
    gm: torch.fx.GraphModule,
    io: dict[str, Any],
    dtype: torch.dtype,
    ranges: list[tuple[float, float]],
) -> None:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    leaves, spec = pytree.tree_flatten(output.args[0])
    floats = 0
    new = []
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, torch.fx.Node) and str(leaf.target) == _DEQUANT_TENSOR:
            io[f"output:{index}"] = _params(leaf)
            new.append(leaf.args[0])
            continue
        if floats >= len(ranges):
            raise ModelError(
                f"output {index} is computed in float and lpq has no calibrated range for it",
                hint="pass options={'outputs': False} to keep float outputs, or quantize "
                "the model again with calibration data",
            )
        lo, hi = ranges[floats]
        floats += 1
        params = _output_params(lo, hi, dtype)
        with gm.graph.inserting_before(output):
            q = gm.graph.call_function(
                torch.ops.quantized_decomposed.quantize_per_tensor.default,
                (
                    leaf,
                    params["scale"],
                    params["zero_point"],
                    params["quant_min"],
                    params["quant_max"],
                    dtype,
                ),
            )
        io[f"output:{index}"] = params
        new.append(q)
    output.args = (pytree.tree_unflatten(new, spec),)


def _output_params(lo: float, hi: float, dtype: torch.dtype) -> dict[str, Any]:
    """Asymmetric scale/zero point covering [lo, hi] (and 0) for ``dtype``."""
    info = torch.iinfo(dtype)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / (info.max - info.min), 1e-12)
    zero_point = round(info.min - lo / scale)
    zero_point = max(info.min, min(info.max, zero_point))
    return {
        "scale": scale,
        "zero_point": zero_point,
        "quant_min": int(info.min),
        "quant_max": int(info.max),
        "dtype": str(dtype).replace("torch.", ""),
    }
