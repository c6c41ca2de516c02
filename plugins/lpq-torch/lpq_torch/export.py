"""lpq_convert (``export``): a quantized model in the form a deployment target takes.

Targets: ``onnx`` (QDQ ONNX, written by :mod:`lpq_torch.backends.onnx_export`) and
``deploy`` (the frozen model simulating a backend scheme, as is). With
``options["backend_scheme"]`` (core passes the chosen backend profile's) the model must
have been quantized with exactly that scheme: deploying a model simulated for another
backend would silently give the wrong arithmetic.
"""

from __future__ import annotations

from typing import Any

import torch

from lpq import ModelError

from . import model_io
from .backends import onnx_export, simulate
from .backends.profiles import parse_scheme

TARGETS = ("onnx", "deploy")


def export(model: Any, target: str, options: dict[str, Any]) -> Any:
    """``onnx`` (a QDQ ``onnx.ModelProto``) or ``deploy`` (the frozen simulated model)."""
    if target not in TARGETS:
        raise ModelError(
            f"lpq-torch cannot convert to {target!r}", hint=f"targets: {', '.join(TARGETS)}"
        )
    module = model_io.require_module(model)
    wanted = options.get("backend_scheme")
    if wanted is not None:
        _check_backend(module, wanted, options.get("backend"))
    if target == "deploy":
        if not simulate.is_simulated(module):
            raise ModelError(
                "only a model lpq quantized for a backend has a deployable form here",
                hint="quantize with a backend profile first (backend='tensorrt', ...)",
            )
        return module
    return onnx_export.to_onnx(module, options)


def _check_backend(module: torch.nn.Module, scheme: Any, backend: Any) -> None:
    """A deploy for a backend takes a model simulated with exactly that backend's scheme."""
    name = f"backend {backend!r}" if backend else "this backend"
    if not simulate.is_simulated(module):
        raise ModelError(
            f"the model is not quantized for {name}",
            hint="pass calibration data to quantize it, or a model lpq quantized with "
            f"backend={backend!r}",
        )
    built = getattr(module, simulate.BACKEND_ATTR)["scheme"]
    if parse_scheme(built) != parse_scheme(scheme):
        raise ModelError(
            f"the model was quantized with another scheme than {name}'s "
            f"({getattr(module, simulate.BACKEND_ATTR).get('backend') or 'a custom scheme'})",
            hint="quantize the fp32 model for this backend, or register a profile for the "
            "scheme you simulated",
        )
