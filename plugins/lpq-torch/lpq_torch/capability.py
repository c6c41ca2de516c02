"""lpq_query_fw_capability and lpq_query_fused_patterns from the exported graph.

The capability YAML (plus any extra files in ``options["capability_files"]``, e.g. one
adding int4 for conv2d) is loaded for the installed torch version and paired with the
quantizable nodes of the model's exported graph. A Hugging Face causal LM is not
exported: its ops are its ``nn.Linear`` modules by path (``lm_head`` its own op type).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from lpq import FrameworkCapability, ModelError, installed_version, load_capability

from . import graph, model_io
from .data import first_batch
from .info import FRAMEWORK, capability_files

#: Ops that follow a conv/linear inside a fused pattern, by their short ATen name.
_FOLLOWERS = {
    "batch_norm": "batch_norm",
    "_native_batch_norm_legit_no_training": "batch_norm",
    "relu": "relu",
    "relu_": "relu",
    "add": "add",
    "add_": "add",
    "hardtanh": "hardtanh",
    "hardtanh_": "hardtanh",
    "silu": "silu",
    "silu_": "silu",
    "gelu": "gelu",
}


def _capability_files(options: dict[str, Any]) -> list[Path]:
    extra = options.get("capability_files") or []
    if isinstance(extra, str | os.PathLike):
        extra = [extra]
    return [*capability_files(), *(Path(p) for p in extra)]


def query_capability(
    model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> FrameworkCapability:
    """The capability YAML for the installed torch, paired with the model's ops.

    The model is exported with the dataloader's first batch (once per run); that batch is
    kept as its example inputs for later jobs that get no data.
    """
    module = model_io.require_module(model)
    spec = load_capability(_capability_files(options), FRAMEWORK, installed_version("torch"))
    if model_io.is_causal_lm(module):
        # an LLM: its Linears by module path, no export (weight-only needs none)
        if dataloader is not None:
            model_io.remember_example(module, first_batch(dataloader))
        return spec.build(model_io.linear_ops(module), installed_version("torch"))
    args = first_batch(dataloader)
    model_io.remember_example(module, args)
    gm = model_io.exported(module, args, copy_graph=False)
    ops = [key for key, _ in graph.quantizable_nodes(gm)]
    return spec.build(ops, installed_version("torch"))


def fused_patterns(model: Any) -> list[tuple[str, ...]]:
    """Fusable op-type chains found in the model (longest YAML pattern per conv/linear)."""
    module = model_io.require_module(model)
    if isinstance(module, torch.fx.GraphModule) and any(graph.quantizable_nodes(module)):
        gm = module
    else:
        example = model_io.example_for(module)
        if example is None:
            raise ModelError(
                "the PyTorch adaptor needs example inputs to export the model",
                hint="query the model's capability with a dataloader first",
            )
        gm = model_io.exported(module, example, copy_graph=False)
    spec = load_capability(capability_files(), FRAMEWORK, installed_version("torch"))
    return find_patterns(gm, spec.patterns)


def find_patterns(
    gm: torch.fx.GraphModule, known: Sequence[tuple[str, ...]]
) -> list[tuple[str, ...]]:
    """For each quantizable node, the longest chain of its followers that ``known`` lists."""
    found: list[tuple[str, ...]] = []
    known_set = set(known)
    for _, node in graph.quantizable_nodes(gm):
        chain = [graph.op_type_of(node) or ""]
        best: tuple[str, ...] | None = None
        current = node
        while len(current.users) == 1:
            user = next(iter(current.users))
            short = _FOLLOWERS.get(getattr(user.target, "__name__", str(user.target)).split(".")[0])
            if user.op != "call_function" or short is None:
                break
            chain.append(short)
            if tuple(chain) in known_set:
                best = tuple(chain)
            current = user
        if best is not None:
            found.append(best)
    return found
