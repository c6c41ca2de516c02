"""Saving and loading models, with lpq's provenance in the ONNX metadata.

A quantized model is an ordinary ``.onnx`` file any ORT can run; lpq adds
``metadata_props`` entries (``lpq.tune_cfg``, ``lpq.ranges``, ...) holding JSON, so that
loading it rebuilds the :class:`QuantizedModel` without recalibration and a tuning run
can be reproduced from the file alone. Writes are atomic; models with 100 MB of weights or
more (LLMs) are written with their tensors in ``<name>.onnx.data`` beside the model file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lpq import ModelError, TuneConfig, atomic_write

from . import model_io, weights
from .qmodel import QuantizedModel

_PREFIX = "lpq."
FORMAT_VERSION = "1"


def _target(path: Path) -> Path:
    return path if path.suffix == ".onnx" else path.with_name(path.name + ".onnx")


def save(model: Any, path: Path) -> Path:
    """Write ``model`` to ``path`` (``.onnx`` appended when missing); return the file.

    A model whose initializers take :data:`EXTERNAL_ABOVE` bytes or more (an LLM) is
    written as ``<name>.onnx`` + ``<name>.onnx.data``, like the exports it came from;
    both files are written under temporary names in the target folder and renamed at
    the end (data first), so no half-written pair is left behind. Neither the model
    nor its weights are copied whole to write them."""
    target = _target(Path(path))
    if isinstance(model, QuantizedModel):
        proto = model.proto
        meta = {
            "format_version": FORMAT_VERSION,
            "tune_cfg": model.tune_cfg.to_json(),
            "ranges": {k: list(v) for k, v in model.ranges.items()},
            "options": model.options,
            "fp32_outputs": model.fp32_outputs,
            "fp32_weights": model.fp32_weights,
        }
    else:
        proto, meta = model_io.to_proto(model), {}
    if _weight_bytes(proto) < EXTERNAL_ABOVE:
        proto = model_io.copy_model(proto) if meta else proto
        _set_meta(proto, meta)
        with atomic_write(target, "wb") as handle:
            handle.write(proto.SerializeToString())
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    data_name = target.name + ".data"
    tmp_data = target.parent / f".{data_name}.{os.getpid()}.tmp"
    tmp_model = target.parent / f".{target.name}.{os.getpid()}.tmp"
    try:
        light = weights.write_split(proto, tmp_data, data_name)
        if meta:
            _set_meta(light, meta)
        with open(tmp_model, "wb") as handle:
            handle.write(light.SerializeToString())
            handle.flush()
            os.fsync(handle.fileno())
        # data first, model last: the model file never points at missing data
        os.replace(tmp_data, target.parent / data_name)
        os.replace(tmp_model, target)
    finally:
        for left in (tmp_data, tmp_model):
            left.unlink(missing_ok=True)
    return target


#: Models whose initializers take this many bytes or more are saved with external data.
EXTERNAL_ABOVE = 100 << 20


def _weight_bytes(proto: Any) -> int:
    return sum(weights.nbytes(init) for init in proto.graph.initializer)


def _set_meta(proto: Any, meta: dict[str, Any]) -> None:
    if not meta:
        return
    kept = [p for p in proto.metadata_props if not p.key.startswith(_PREFIX)]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key = _PREFIX + key
        entry.value = json.dumps(value, default=str)


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
