"""The ``.pt2`` file format of lpq-torch: writing, vetting and reading ``torch.export`` archives.

Below the save/load job (:mod:`lpq_torch.persist`) and below model preparation, which
reads a ``.pt2`` path passed where a model is expected (:func:`lpq_torch.model_io.
require_module`): so both can read archives without importing each other.

Writing uses ``torch.export.save`` into a temporary file that is moved into place
(atomic). lpq's metadata (the tune_cfg, integer input/output parameters) is stored beside
the program as an extra JSON file.

Reading uses ``torch.export.load`` - but only after :func:`check_archive` has vetted the
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

from . import graph
from .info import EXAMPLE_ATTR, IO_ATTR, TUNE_CFG_ATTR

_META = "lpq.json"


def write(program: torch.export.ExportedProgram, meta: dict[str, Any], target: Path) -> Path:
    """Write ``program`` with lpq's ``meta`` to ``target`` atomically; returns ``target``."""
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


def read(path: Path) -> torch.fx.GraphModule:
    """The model in a vetted ``.pt2`` file, with lpq's attributes restored from its metadata."""
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
