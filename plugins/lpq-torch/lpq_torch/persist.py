"""Save/load of (quantized) models as ``torch.export`` archives (``.pt2``).

Saving exports the model (for a quantized one: the converted PT2E graph, with folded
int8 weights and calibrated scales baked in; an fp32 model reuses the run's export) and
writes it with ``torch.export.save`` into a temporary file that is moved into place
(atomic). The tune_cfg is stored beside the program as an extra JSON file.

Loading uses ``torch.export.load`` - but only after :func:`check_archive` has vetted the
file, because ``torch.export.load`` itself is *not* pickle-free: it unpickles weights or
constants flagged ``use_pickle``, custom/opaque objects and legacy ``.pt`` payloads with
``weights_only=False``, and falls back to ``weights_only=False`` when the sample inputs fail
to load safely. lpq refuses any archive containing such entries, so loading deserialises
a graph and raw tensors only: no recalibration, and no code from the file runs.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from lpq import ModelError

from . import graph, prepare
from .data import require_module
from .prepare import EXAMPLE_ATTR, example_for
from .quantize import TUNE_CFG_ATTR

#: Attribute of a model with integer inputs/outputs (same as :data:`lpq_torch.edit.IO_ATTR`;
#: not imported from there, which imports this package's heavier modules).
IO_ATTR = "_lpq_io"

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
    if hasattr(module, TUNE_CFG_ATTR) or isinstance(module, torch.fx.GraphModule):
        program = prepare.export(module, example)  # a converted graph: export it as it is
    else:
        program = prepare.exported_program(module, example)  # the run's fp32 export
    meta = {
        "format": "lpq-torch/1",
        "tune_cfg": getattr(module, TUNE_CFG_ATTR, None),
        "io": getattr(module, IO_ATTR, None),  # integer inputs/outputs (quantize_input)
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a private folder beside the target under the final file name (the
    # archive's inner folder is named after the file), then move it into place.
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp = tmp_dir / target.name
    try:
        torch.export.save(program, str(tmp), extra_files={_META: json.dumps(meta)})
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        tmp_dir.rmdir()
    return target


def check_archive(path: Path) -> None:
    """Refuse a ``.pt2`` whose loading would unpickle anything but plain tensors."""
    from torch.export.pt2_archive import constants as pt2

    def refuse(why: str) -> ModelError:
        return ModelError(
            f"refusing to load {path}: {why}; loading it would unpickle arbitrary Python "
            "objects (possible code execution)",
            hint="only load .pt2 files written by torch.export.save / lpq from trusted models",
        )

    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelError(
            f"cannot read {path} as a .pt2 archive ({exc})",
            hint="pass a .pt2 file written by lpq's save_model or torch.export.save",
        ) from exc
    with archive:
        for name in archive.namelist():
            inner = name.split("/", 1)[1] if "/" in name else name
            if inner.startswith((pt2.WEIGHTS_DIR, pt2.CONSTANTS_DIR)):
                if inner.endswith(".pt"):
                    raise refuse(f"it holds a legacy pickled payload ({inner})")
                if inner.endswith(".json"):
                    _check_payload_config(archive.read(name), inner, refuse)
            elif inner.startswith(pt2.SAMPLE_INPUTS_DIR):
                try:
                    torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as exc:
                    raise refuse(f"its sample inputs are not plain tensors ({exc})") from exc


def _check_payload_config(raw: bytes, inner: str, refuse: Any) -> None:
    from torch.export.pt2_archive import constants as pt2

    try:
        config = json.loads(raw).get("config", {})
    except (json.JSONDecodeError, AttributeError) as exc:
        raise refuse(f"{inner} is not valid JSON") from exc
    for fqn, entry in config.items():
        if not isinstance(entry, dict) or entry.get("use_pickle"):
            raise refuse(f"tensor {fqn!r} is stored pickled")
        path_name = str(entry.get("path_name", ""))
        if inner.startswith(pt2.CONSTANTS_DIR) and not path_name.startswith(
            pt2.TENSOR_CONSTANT_FILENAME_PREFIX
        ):
            raise refuse(f"constant {fqn!r} is a pickled Python object")


def load(path: Path) -> torch.fx.GraphModule:
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist", hint="check the path")
    check_archive(path)
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
    if meta.get("io"):
        setattr(module, IO_ATTR, meta["io"])
    if not any(graph.quantizable_nodes(module)):
        graph.stamp_op_names(module)
    return module
