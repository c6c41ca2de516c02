"""Save/load of (quantized) models as ``torch.export`` archives (``.pt2``).

Saving re-exports the model (for a quantized one: the converted PT2E graph, with folded
int8 weights and calibrated scales baked in) and writes it with ``torch.export.save`` into
a temporary file that is moved into place (atomic). The tune_cfg is stored beside the
program as an extra JSON file. Loading uses ``torch.export.load``, which deserialises a
graph and tensors - it never unpickles arbitrary Python objects - so no recalibration and
no code execution from the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from lpq import ModelError

from . import graph
from .data import require_module
from .quantize import EXAMPLE_ATTR, TUNE_CFG_ATTR, example_for

SUFFIX = ".pt2"
_META = "lpq.json"


def save(model: Any, path: Path) -> Path:
    module = require_module(model)
    example = example_for(module)
    if example is None:
        raise ModelError(
            "the PyTorch adaptor needs example inputs to export this model for saving",
            hint="save a model returned by lpq's quantize, or query its capability first",
        )
    target = path if path.suffix == SUFFIX else path.with_name(path.name + SUFFIX)
    program = graph.export(module, example)
    meta = {"format": "lpq-torch/1", "tune_cfg": getattr(module, TUNE_CFG_ATTR, None)}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        torch.export.save(program, tmp, extra_files={_META: json.dumps(meta)})
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load(path: Path) -> torch.fx.GraphModule:
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist", hint="check the path")
    extra = {_META: ""}
    try:
        program = torch.export.load(str(path), extra_files=extra)
    except Exception as exc:
        raise ModelError(
            f"cannot load {path} as a torch.export archive ({type(exc).__name__}: {exc})",
            hint="pass a .pt2 file written by lpq's save_model or torch.export.save",
        ) from exc
    module = program.module()
    example = program.example_inputs
    if example is not None:
        setattr(module, EXAMPLE_ATTR, (tuple(example[0]), dict(example[1])))
    try:
        meta = json.loads(extra[_META]) if extra[_META] else {}
    except json.JSONDecodeError:
        meta = {}
    if meta.get("tune_cfg") is not None:
        setattr(module, TUNE_CFG_ATTR, meta["tune_cfg"])
    if not any(graph.quantizable_nodes(module)):
        graph.stamp_op_names(module)
    return module
