"""lpq_convert_bf16 (``cast_lowp``): chosen ops in bf16/fp16, by casts in the exported graph.

Working on the exported graph (rather than autocast) keeps the choice per op and makes it
survive save/load; each listed conv/linear/matmul node gets its tensor inputs cast to the
low-precision dtype and its output cast back to fp32, so neighbours are unaffected.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lpq import ConfigError, ModelError

from . import graph, model_io
from .info import EXAMPLE_ATTR

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cast_nodes(gm: torch.fx.GraphModule, op_names: Sequence[str], dtype: str) -> None:
    """Rewrite ``gm`` in place so the named ops compute in ``dtype``."""
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown float precision {dtype!r}", hint="use bf16 or fp16")
    target = _DTYPES[dtype]
    nodes = {key[0]: node for key, node in graph.quantizable_nodes(gm)}
    missing = [name for name in op_names if name not in nodes]
    if missing:
        raise ConfigError(
            f"no quantizable op named {', '.join(missing[:5])} in the model",
            hint="use op names from the capability query",
        )
    g = gm.graph
    cast = torch.ops.aten._to_copy.default
    for name in op_names:
        node = nodes[name]
        with g.inserting_before(node):
            new_args = tuple(
                g.call_function(cast, (arg,), {"dtype": target})
                if isinstance(arg, torch.fx.Node)
                else arg
                for arg in node.args
            )
        node.args = new_args
        with g.inserting_after(node):
            back = g.call_function(cast, (node,), {"dtype": torch.float32})
        node.replace_all_uses_with(back, delete_user_cb=_not(back))
    g.lint()
    gm.recompile()


def _not(node: torch.fx.Node) -> Callable[[torch.fx.Node], bool]:
    """A ``delete_user_cb`` that rewires every user except the new cast node itself."""

    def keep(user: torch.fx.Node) -> bool:
        return user is not node

    return keep


def cast_lowp(model: Any, op_names: Sequence[str], dtype: str) -> torch.fx.GraphModule:
    """A new model whose named ops run in ``dtype`` (the input model is left untouched)."""
    if isinstance(model, torch.fx.GraphModule) and any(graph.quantizable_nodes(model)):
        result = copy.deepcopy(model)
    elif isinstance(model, torch.nn.Module):
        example = model_io.example_for(model)
        if example is None:
            raise ModelError(
                "the PyTorch adaptor needs example inputs to export this model before "
                "converting ops to low precision",
                hint="query its capability (or quantize it) with a dataloader first",
            )
        result = model_io.exported(model, example)
        setattr(result, EXAMPLE_ATTR, example)
    else:
        raise ModelError(
            f"the PyTorch adaptor needs a torch.nn.Module, got {type(model).__qualname__}"
        )
    cast_nodes(result, op_names, dtype)
    return result
