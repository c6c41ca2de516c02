"""Save / load as MXNet's own export format, with the tune_cfg beside it.

``save(model, "out/model")`` writes ``out/model-0000.params`` (MXNet's NDArray file: raw
tensors, no pickle), ``out/model-lpq.json`` (input names, precision, tunable ops, the
tune_cfg and the params file's SHA-256) and ``out/model-symbol.json`` (the graph, AMP
casts kept), each atomically, the symbol last. Loading checks the SHA-256, so a crash
between two files or files mixed from two saves are refused instead of loaded wrongly.
Any ``HybridBlock.export`` pair loads too (without the lpq file it is an fp32 model).
Reading an export is :func:`lpq_mxnet.model_io.read_export`, shared with every job that
takes a path.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import lpq

from .framework import mxnet
from .graph import graph_json
from .info import meta_path, params_path, prefix_of, symbol_path
from .model_io import META_FORMAT, read_export, to_graph


def save(model: Any, path: Path) -> Path:
    """Write ``model`` under the prefix ``path`` names; returns the symbol file."""
    mx = mxnet()
    graph = to_graph(model)
    info = graph.info or graph.default_info()
    prefix = prefix_of(Path(path))
    with tempfile.TemporaryDirectory(prefix="lpq-mxnet-") as tmp:
        staged = Path(tmp) / "model.params"
        mx.nd.save(str(staged), graph.params)
        payload = staged.read_bytes()
    with lpq.atomic_write(params_path(prefix), "wb") as handle:
        handle.write(payload)
    lpq.write_json(
        meta_path(prefix),
        {
            "format": META_FORMAT,
            "inputs": list(graph.input_names),
            "precision": info.precision,
            "ops": [list(op) for op in info.ops],
            "tune_cfg": info.tune_cfg,
            "params_sha256": hashlib.sha256(payload).hexdigest(),
        },
    )
    target = symbol_path(prefix)
    with lpq.atomic_write(target) as handle:
        handle.write(json.dumps(graph_json(graph.symbol), indent=2))
    return target


def load(path: Path) -> Any:
    """The saved model as a ready-to-run block (hybridized, static shapes)."""
    graph = read_export(path)
    return graph.block()
