"""Saving and loading ``.tflite`` models, with lpq's provenance in the TFLite metadata.

A quantized model is an ordinary ``.tflite`` any LiteRT runs; lpq adds metadata entries
(``lpq.tune_cfg``, ``lpq.float_ops``, ...) holding JSON, so loading it rebuilds the
:class:`QuantizedModel` (per-op precision and inspection keyed by the fp32 names) without
the fp32 model, and a tuning result can be reproduced from the file alone. An fp32 model
is saved as its float ``.tflite``. Writes are atomic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lpq import ModelError, TuneConfig, atomic_write

from . import graph as graph_mod
from .model_io import prepare
from .qmodel import QuantizedModel

_PREFIX = "lpq."
FORMAT_VERSION = "1"


def _target(path: Path) -> Path:
    return path if path.suffix == ".tflite" else path.with_name(path.name + ".tflite")


def save(model: Any, path: Path) -> Path:
    """Write ``model`` to ``path`` (``.tflite`` appended when missing); return the file."""
    target = _target(Path(path))
    if isinstance(model, QuantizedModel):
        meta = {
            "format_version": FORMAT_VERSION,
            "tune_cfg": model.tune_cfg.to_json(),
            "float_ops": [list(op) for op in model.float_ops],
            "quantizable": model.quantizable,
            "backend": model.backend,
            "options": model.options,
        }
        content = graph_mod.with_metadata(
            model.content,
            {_PREFIX + k: json.dumps(v, default=str).encode() for k, v in meta.items()},
        )
    else:
        content = prepare(model).float_tflite
    with atomic_write(target, "wb") as handle:
        handle.write(content)
    return target


def load(path: Path) -> Any:
    """A :class:`QuantizedModel` for a file lpq quantized; the path of any other .tflite."""
    file = Path(path)
    if not file.is_file() and _target(file).is_file():
        file = _target(file)
    if not file.is_file():
        raise ModelError(f"{file}: no such model file", hint="check the path")
    content = file.read_bytes()
    try:
        meta = graph_mod.read(content).metadata
    except ModelError as exc:
        raise ModelError(f"{file}: {exc.message}", hint=exc.hint) from None
    if _PREFIX + "tune_cfg" not in meta:
        return file
    try:
        values = {
            k[len(_PREFIX) :]: json.loads(v) for k, v in meta.items() if k.startswith(_PREFIX)
        }
        return QuantizedModel(
            content,
            TuneConfig.from_json(values["tune_cfg"]),
            [(str(a), str(b), str(c)) for a, b, c in values["float_ops"]],
            values.get("backend", "unknown"),
            quantizable=list(values.get("quantizable", [])),
            options=dict(values.get("options", {})),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelError(
            f"{file}: the lpq metadata is damaged ({exc})",
            hint="re-save the model with lpq, or strip its lpq.* metadata",
        ) from None
