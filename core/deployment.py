"""``lpq.deploy``: a model quantized for a backend, as the files the backend's tools
consume (the ``lpq deploy`` command in ``cli/deploy.py`` is a thin wrapper).

Steps (framework-neutral; the adaptor and the profile do the framework work):

1. quantize the model with the backend profile's scheme (``lpq.quantize`` with
   ``backend=NAME``: the capability narrowed to what the backend runs, the scheme
   simulated bit-exactly), unless it already is;
2. ``lpq_convert(target="onnx")``: the adaptor exports the quantized model as ONNX with
   QDQ nodes that encode exactly that quantization (batch norm folded);
3. the profile's ``writer`` writes the backend's parameter file(s) from that ONNX model
   (TensorRT calibration cache, SNPE/QNN encodings, Vitis AI fixed-point positions, ...);
4. ``deploy.json`` lists every file written and what it is for.

See docs/backends.md for each backend's files and the tools that read them.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, ModelError
from .fileio import atomic_write, write_json

#: Name of the QDQ ONNX model in the output folder.
MODEL_FILE = "model.onnx"
MANIFEST = "deploy.json"


@dataclass
class DeployResult:
    """What ``deploy`` wrote, and the quantized model it deployed."""

    backend: str
    framework: str
    out_dir: Path
    #: File name (in ``out_dir``) -> what it is and which tool reads it.
    files: dict[str, str] = field(default_factory=dict)
    model: Any = None
    onnx_model: Any = None

    def path(self, name: str) -> Path:
        return self.out_dir / name

    def summary(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "framework": self.framework,
            "out_dir": str(self.out_dir),
            "files": dict(self.files),
        }


def load_writer(spec: str) -> Callable[..., dict[str, str]]:
    """Import a profile's writer, ``"package.module:function"``."""
    module_name, _, attribute = spec.partition(":")
    try:
        writer = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"the backend profile's writer {spec!r} cannot be imported ({exc})",
            hint="a writer is 'package.module:function'; is its package installed?",
        ) from exc
    if not callable(writer):
        raise ConfigError(f"the backend profile's writer {spec!r} is not a function")
    return writer


def deploy(
    model: Any,
    backend: str,
    out: str | Path,
    calib_dataloader: Any = None,
    *,
    tune_cfg: Any = None,
    conf: Any = None,
    opset: int = 17,
) -> DeployResult:
    """Quantize ``model`` for ``backend`` (if needed) and write its deployment files.

    :param model: an fp32 model (with ``calib_dataloader``), or a model already quantized
        for this backend: a ``QuantizedModel`` / ``TuningResult`` from ``lpq.quantize`` /
        ``lpq.fit`` with ``backend=...``, or the adaptor's quantized model (e.g. after
        quantization-aware training).
    :param backend: a backend profile name (``lpq plugins list -v`` shows who registers
        them; docs/backends.md lists lpq's own).
    :param out: folder to write into (created; files in it are replaced atomically).
    :param tune_cfg: quantize with this exact configuration instead of the default one.
    :param conf: a ``PostTrainingQuantConfig`` for that quantization (its ``backend`` is
        set to ``backend``).
    :return: the files written, what each is, and the quantized model.
    """
    from .api import QuantizedModel, quantize
    from .config import PostTrainingQuantConfig
    from .plugins.manager import get_plugin_manager

    pm = get_plugin_manager()
    profile = pm.backend_profile(backend)
    framework = profile.framework
    writer = load_writer(profile.writer) if profile.writer else None  # fail before the work
    given = model.framework if isinstance(model, QuantizedModel) else pm.detect_framework(model)
    if given != framework:
        raise ConfigError(
            f"backend profile {backend!r} is for {framework} models, but this is a {given} model",
            hint="pick a profile of the model's framework (docs/backends.md lists them)",
        )
    if isinstance(model, QuantizedModel):
        quantized = model.model
    elif calib_dataloader is not None or tune_cfg is not None:
        settings = dataclasses.replace(
            conf or PostTrainingQuantConfig(),
            backend=backend,
            framework=(conf.framework if conf is not None else None) or framework,
        )
        quantized = quantize(model, settings, calib_dataloader, tune_cfg=tune_cfg).model
    else:
        quantized = model
    options: dict[str, Any] = {"opset": opset, "backend": backend}
    if profile.quant_scheme is not None:
        options["backend_scheme"] = profile.quant_scheme.to_json()
    onnx_model = pm.convert(framework, quantized, "onnx", options)
    if not hasattr(onnx_model, "SerializeToString"):
        raise ModelError(f"the {framework} adaptor's ONNX conversion returned no ONNX model")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / MODEL_FILE, "wb") as handle:
        handle.write(onnx_model.SerializeToString())
    files = {MODEL_FILE: "ONNX model with QuantizeLinear/DequantizeLinear nodes (QDQ)"}
    if writer is not None:
        files.update(writer(onnx_model, folder, profile))
    files[MANIFEST] = "this list"
    result = DeployResult(backend, framework, folder, files, quantized, onnx_model)
    write_json(folder / MANIFEST, {**result.summary(), "description": profile.description})
    return result
