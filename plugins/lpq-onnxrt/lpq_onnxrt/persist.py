"""Saving and loading models, with lpq's provenance in the ONNX metadata.

A quantized model is an ordinary ``.onnx`` file any ORT can run; lpq adds
``metadata_props`` entries (``lpq.tune_cfg``, ``lpq.ranges``, ...) holding JSON, so that
loading it rebuilds the :class:`QuantizedModel` without recalibration and a tuning run
can be reproduced from the file alone. Writes are atomic; models above the 2 GB protobuf
limit are written with their tensors in ``<name>.data`` beside the model file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lpq import ModelError, TuneConfig, atomic_write

from . import model_io
from .qmodel import QuantizedModel

_PREFIX = "lpq."
FORMAT_VERSION = "1"


def _target(path: Path) -> Path:
    return path if path.suffix == ".onnx" else path.with_name(path.name + ".onnx")


def save(model: Any, path: Path) -> Path:
    """Write ``model`` to ``path`` (``.onnx`` appended when missing); return the file."""
    import onnx

    target = _target(Path(path))
    if isinstance(model, QuantizedModel):
        proto = model_io.copy_model(model.proto)
        meta = {
            "format_version": FORMAT_VERSION,
            "tune_cfg": model.tune_cfg.to_json(),
            "ranges": {k: list(v) for k, v in model.ranges.items()},
            "options": model.options,
            "fp32_outputs": model.fp32_outputs,
            "fp32_weights": model.fp32_weights,
        }
        kept = [p for p in proto.metadata_props if not p.key.startswith(_PREFIX)]
        del proto.metadata_props[:]
        proto.metadata_props.extend(kept)
        for key, value in meta.items():
            entry = proto.metadata_props.add()
            entry.key = _PREFIX + key
            entry.value = json.dumps(value, default=str)
    else:
        proto = model_io.to_proto(model)
    if proto.ByteSize() < model_io.PROTO_LIMIT:
        with atomic_write(target, "wb") as handle:
            handle.write(proto.SerializeToString())
        return target
    # Large model: write both files in a scratch folder beside the target, then move
    # the data file first and the model file last, so the model never points at
    # missing data.
    target.parent.mkdir(parents=True, exist_ok=True)
    data_name = target.name + ".data"
    with tempfile.TemporaryDirectory(prefix=".lpq-save-", dir=target.parent) as tmp:
        scratch = Path(tmp) / target.name
        onnx.save_model(
            proto,
            str(scratch),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data_name,
            size_threshold=1024,
        )
        os.replace(Path(tmp) / data_name, target.parent / data_name)
        os.replace(scratch, target)
    return target


def load(path: Path) -> Any:
    """Load a file written by :func:`save` (or any ONNX file)."""
    file = Path(path)
    if not file.is_file() and _target(file).is_file():
        file = _target(file)
    proto = model_io.load_file(file)
    meta = {
        p.key[len(_PREFIX) :]: p.value for p in proto.metadata_props if p.key.startswith(_PREFIX)
    }
    if "tune_cfg" not in meta:
        return proto
    try:
        ranges = {
            k: (float(v[0]), float(v[1])) for k, v in json.loads(meta.get("ranges", "{}")).items()
        }
        return QuantizedModel(
            proto,
            TuneConfig.from_json(json.loads(meta["tune_cfg"])),
            ranges,
            json.loads(meta.get("options", "{}")),
            fp32_outputs=json.loads(meta.get("fp32_outputs", "{}")),
            fp32_weights=json.loads(meta.get("fp32_weights", "{}")),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelError(
            f"{file}: the lpq metadata is damaged ({exc})",
            hint="re-save the model with lpq, or strip the lpq.* metadata_props",
        ) from None
