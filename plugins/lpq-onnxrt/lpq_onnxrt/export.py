"""Handing a model over in another form: the ``lpq_convert`` job.

ORT runs ONNX itself, so the one target is ``onnx``: the model's ``ModelProto`` (QDQ or
QOperator, as it was quantized), a copy the caller may change freely.
"""

from __future__ import annotations

from typing import Any

import lpq

from .model_io import copy_model, to_proto
from .qmodel import QuantizedModel

#: Targets ``lpq_convert`` offers for ONNX models.
EXPORT_TARGETS = ("onnx",)


def export(model: Any, target: str, options: dict[str, Any]) -> Any:
    """``onnx``: the model's ONNX proto (QDQ or QOperator as quantized)."""
    if target not in EXPORT_TARGETS:
        raise lpq.ModelError(
            f"the onnxrt adaptor cannot convert to {target!r}",
            hint=f"targets it offers: {', '.join(EXPORT_TARGETS)}",
        )
    proto = model.proto if isinstance(model, QuantizedModel) else to_proto(model)
    return copy_model(proto)
