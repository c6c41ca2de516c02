"""Save / load as MXNet's own export format, with the tune_cfg beside it.

``save(model, "out/model")`` writes ``out/model-0000.params`` (MXNet's NDArray file: raw
tensors, no pickle), ``out/model-lpq.json`` (input names, precision, tunable ops, the
tune_cfg and the params file's SHA-256) and ``out/model-symbol.json`` (the graph, AMP
casts kept), each atomically, the symbol last. Loading checks the SHA-256, so a crash
between two files or files mixed from two saves are refused instead of loaded wrongly.
Any ``HybridBlock.export`` pair loads too (without the lpq file it is an fp32 model).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import lpq
from lpq import ModelError

from .exports import find_export, meta_path, params_path, prefix_of, symbol_path
from .framework import mxnet
from .graph import graph_json, is_quantized, tunable_ops
from .model import Graph, ModelInfo, to_graph

FORMAT = "lpq-mxnet/1"


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
            "format": FORMAT,
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


def read_export(path: str | Path) -> Graph:
    """An export on disk as a :class:`Graph` (with its lpq metadata when present)."""
    mx = mxnet()
    found = find_export(path)
    if found is None:
        raise ModelError(
            f"{path} is not an MXNet model: no PREFIX-symbol.json there",
            hint="pass PREFIX-symbol.json, PREFIX-NNNN.params or PREFIX, as written by "
            "HybridBlock.export(PREFIX) or lpq",
        )
    if found.params is None:
        raise ModelError(
            f"{found.symbol} has no parameter file beside it",
            hint=f"put {found.prefix.name}-0000.params (from HybridBlock.export) next to it",
        )
    meta = _read_meta(found.meta, found.params)
    try:
        symbol = mx.sym.load(str(found.symbol))
        params = mx.nd.load(str(found.params))
    except mx.base.MXNetError as exc:
        raise ModelError(
            f"cannot read the MXNet model {found.symbol}: {str(exc).splitlines()[0][:300]}",
            hint="re-export it with HybridBlock.export",
        ) from exc
    if not isinstance(params, dict) or not all(k[:4] in ("arg:", "aux:") for k in params):
        raise ModelError(
            f"{found.params} does not hold arg:/aux: parameters",
            hint="use the .params file HybridBlock.export wrote (not save_parameters)",
        )
    if meta is not None:
        names = list(meta["inputs"])
    else:
        known = {k[4:] for k in params}
        names = [n for n in symbol.list_inputs() if n not in known]
    graph = Graph(symbol, params, names)
    if meta is not None:
        ops = [(str(name), str(op_type)) for name, op_type in meta["ops"]]
        graph.info = ModelInfo(symbol, names, meta["precision"], ops, meta.get("tune_cfg"))
    elif is_quantized(graph.json()):  # someone's quantized export: its own fused graph
        graph.info = ModelInfo(symbol, names, "int8", tunable_ops(graph.json()))
    return graph


def _read_meta(meta: Path, params: Path) -> dict[str, Any] | None:
    if not meta.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {meta}: {exc}", hint="save the model again") from exc
    if data.get("format") != FORMAT:
        raise ModelError(
            f"{meta} is not an lpq-mxnet file (format {data.get('format')!r})",
            hint="save the model again with this version of lpq-mxnet",
        )
    digest = hashlib.sha256(params.read_bytes()).hexdigest()
    if digest != data.get("params_sha256"):
        raise ModelError(
            f"{params} does not belong to {meta} (an interrupted save, or files from "
            "two different saves)",
            hint="save the model again",
        )
    return data
