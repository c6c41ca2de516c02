"""The capability of a concrete model (lpq_query_fw_capability) and its fused patterns
(lpq_query_fused_patterns), read from the fused graph.

The capability YAML (plus any files in ``options["capability_files"]``) is loaded for the
installed MXNet version and paired with the model's tunable ops: one per oneDNN fusion
group anchored by a Convolution / FullyConnected, plus standalone Pooling, Flatten,
Concat and elemwise_add (see :mod:`lpq_mxnet.graph`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lpq import FrameworkCapability, installed_version, load_capability

from . import data
from .graph import fused_types
from .info import FRAMEWORK, capability_files
from .model_io import fp32_graph


def _capability_files(options: dict[str, Any]) -> list[Path]:
    extra = options.get("capability_files") or []
    if isinstance(extra, str | os.PathLike):
        extra = [extra]
    return [*capability_files(), *(Path(p) for p in extra)]


def _example(dataloader: Iterable[Any] | None) -> Any:
    if dataloader is None:
        return None
    first, _ = data.peek(dataloader, "the capability query")
    return first


def query_capability(
    model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> FrameworkCapability:
    graph = fp32_graph(model, _example(dataloader))
    version = installed_version("mxnet")
    spec = load_capability(_capability_files(options), FRAMEWORK, version)
    return spec.build(graph.tunable_ops(), version)


def fused_patterns(model: Any) -> list[tuple[str, ...]]:
    """The op-type sequences oneDNN fuses in this model, one per fused group: read from
    MXNet's own partition of the graph, so they are what will run fused."""
    return fused_types(fp32_graph(model).fused_json())
