"""Save/load of (quantized) models as ``torch.export`` archives (``.pt2``).

Saving exports the model (for a quantized one: the converted PT2E graph, with folded
int8 weights and calibrated scales baked in; an fp32 model reuses the run's export) and
writes it with the tune_cfg beside it. Loading vets the archive before ``torch.export``
reads it, so no pickled object in the file is ever unpickled. The file format itself
(atomic writing, vetting, metadata) is :mod:`lpq_torch.archive`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lpq import ModelError

from . import archive, model_io
from .info import IO_ATTR, MODEL_SUFFIX, TUNE_CFG_ATTR


def save(model: Any, path: Path) -> Path:
    """Write ``model`` to ``path`` (``.pt2`` appended if missing); returns the file written."""
    module = model_io.require_module(model)
    example = model_io.example_for(module)
    if example is None:
        raise ModelError(
            "the PyTorch adaptor needs example inputs to export this model for saving",
            hint="save a model returned by lpq's quantize, or query its capability first",
        )
    target = path if path.suffix == MODEL_SUFFIX else path.with_name(path.name + MODEL_SUFFIX)
    if hasattr(module, TUNE_CFG_ATTR) or isinstance(module, torch.fx.GraphModule):
        program = model_io.export(module, example)  # a converted graph: export it as it is
    else:
        program = model_io.exported_program(module, example)  # the run's fp32 export
    meta = {
        "format": "lpq-torch/1",
        "tune_cfg": getattr(module, TUNE_CFG_ATTR, None),
        "io": getattr(module, IO_ATTR, None),  # integer inputs/outputs (quantize_input)
    }
    return archive.write(program, meta, target)


def load(path: Path) -> torch.fx.GraphModule:
    """The model in a ``.pt2`` file lpq (or ``torch.export.save``) wrote, vetted first."""
    return archive.read(path)
