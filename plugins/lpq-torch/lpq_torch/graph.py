"""Exporting a model with ``torch.export`` and naming its quantizable ops.

Op names must survive export -> prepare -> convert -> save -> load, so each quantizable
node is stamped with ``node.meta["custom"]["lpq_op"]``; ``torch.export`` serialises the
``custom`` metadata, so a reloaded model still maps its nodes back to fp32 op names.

Naming rule: the fully qualified name of the innermost ``nn.Module`` that produced the node
(``features.0``) when that module owns exactly one quantizable node, otherwise
``<module path>/<node name>`` (functional calls, several matmuls in one attention block).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from lpq import DataError, ModelError, OpKey

from .data import CallArgs, at_least_two, describe, require_module, run

#: ATen ops lpq can quantize, mapped to the op type used in the capability YAML.
QUANTIZABLE = {
    "aten.conv1d.default": "conv1d",
    "aten.conv2d.default": "conv2d",
    "aten.linear.default": "linear",
    "aten.matmul.default": "matmul",
}
LPQ_OP = "lpq_op"


def op_type_of(node: torch.fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    return QUANTIZABLE.get(str(node.target))


def export(model: Any, args: CallArgs, *, training: bool = False) -> torch.export.ExportedProgram:
    """Export ``model`` with a dynamic batch dimension, with lpq errors for user mistakes.

    The model is run eagerly first so that inputs which do not fit are reported as a
    :class:`lpq.DataError`, separately from constructs ``torch.export`` cannot capture
    (:class:`lpq.ModelError`). The model's train/eval mode is restored afterwards.
    """
    module = require_module(model)
    args = at_least_two(args)
    was_training = module.training
    _set_mode(module, training)
    try:
        with torch.no_grad():
            run(module, args)
        program = _export(module, args)
    finally:
        _set_mode(module, was_training)
    stamp_op_names(program.graph_module)
    return program


def _set_mode(module: torch.nn.Module, training: bool) -> None:
    """train()/eval(), except on exported graphs, which refuse it (they are already fixed)."""
    with contextlib.suppress(NotImplementedError):
        module.train(training)


def _export(module: torch.nn.Module, args: CallArgs) -> torch.export.ExportedProgram:
    positional, keywords = args
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(
                module, positional, keywords, dynamic_shapes=_batch_dynamic(module, args)
            )
    except Exception as exc:  # torch raises many types; all mean "cannot export"
        raise ModelError(
            f"torch.export could not capture the model ({type(exc).__name__}): {_first_line(exc)}",
            hint=_export_hint(str(exc)) + f" (example inputs: {describe(args)})",
        ) from exc


def _batch_dynamic(module: torch.nn.Module, args: CallArgs) -> dict[str, Any] | None:
    """Mark dim 0 of every tensor input AUTO-dynamic (export keeps it static if it must)."""
    try:
        bound = inspect.signature(module.forward).bind(*args[0], **args[1])
    except TypeError:
        return None  # export reports the mismatch itself
    specs: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        param = bound.signature.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            return None
        specs[name] = _dim0(value)
    return specs


def _dim0(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {0: torch.export.Dim.AUTO} if value.dim() > 0 else None
    if isinstance(value, list | tuple):
        return type(value)(_dim0(v) for v in value)
    if isinstance(value, dict):
        return {k: _dim0(v) for k, v in value.items()}
    return None


def _export_hint(message: str) -> str:
    lowered = message.lower()
    if "data-dependent" in lowered or "data dependent" in lowered or "guardondata" in lowered:
        return (
            "forward() branches or loops on tensor values (data-dependent control flow); "
            "rewrite it with torch.where / torch.cond, or move the decision out of forward()"
        )
    if "unsupported" in lowered or "graph break" in lowered:
        return (
            "forward() uses a Python construct torch.export cannot trace (e.g. calls into "
            "non-torch libraries, .item()/.numpy(), print of tensors); keep forward() pure torch"
        )
    return "make forward() exportable with torch.export (see the message above)"


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__


def stamp_op_names(gm: torch.fx.GraphModule) -> None:
    """Give every quantizable node its lpq op name (see the module docstring).

    Nodes that already carry a name (a re-exported lpq graph) keep it.
    """
    nodes = [
        (n, t) for n in gm.graph.nodes if (t := op_type_of(n)) is not None and op_key(n) is None
    ]
    owners: dict[str, int] = {}
    for node, _ in nodes:
        owners[_owner(node)] = owners.get(_owner(node), 0) + 1
    for node, op_type in nodes:
        owner = _owner(node)
        if owner and owners[owner] == 1:
            name = owner
        else:
            name = f"{owner}/{node.name}" if owner else node.name
        node.meta.setdefault("custom", {})[LPQ_OP] = f"{name}|{op_type}"


def _owner(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    fqn = list(stack.values())[-1][0]
    return str(fqn)


def op_key(node: torch.fx.Node) -> OpKey | None:
    """The ``(op name, op type)`` stamped on ``node``, if it is a quantizable op."""
    tag = (node.meta.get("custom") or {}).get(LPQ_OP)
    if not tag:
        return None
    name, op_type = str(tag).rsplit("|", 1)
    return name, op_type


def quantizable_nodes(gm: torch.fx.GraphModule) -> Iterator[tuple[OpKey, torch.fx.Node]]:
    """Quantizable nodes of an exported/converted graph, in graph order."""
    for node in gm.graph.nodes:
        key = op_key(node)
        if key is not None and op_type_of(node) is not None:
            yield key, node


def check_batch(args: CallArgs) -> None:
    if not args[0] and not args[1]:
        raise DataError("the first batch holds no inputs", hint="yield at least one input")
