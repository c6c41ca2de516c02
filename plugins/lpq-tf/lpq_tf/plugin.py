"""lpq hook implementations for TensorFlow / Keras / LiteRT (entry point ``tf``).

This module stays tiny and framework-free: registration, detection and the import of this
module never import tensorflow, keras or ai-edge-litert, so ``lpq plugins list`` stays
fast. Per-framework hooks return ``None`` unless ``framework == "tf"`` and then delegate to
modules that import the framework lazily.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Literal

import lpq

FRAMEWORK = "tf"
#: Distributions that provide the ``tensorflow`` package, in the order lpq looks for them.
TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-intel", "tf-nightly")
KERAS_SUFFIX = ".keras"
TFLITE_SUFFIX = ".tflite"
_TFLITE_IDENTIFIER = b"TFL3"  # flatbuffer file identifier, bytes 4..8 of a .tflite
_ZIP_MAGIC = b"PK\x03\x04"  # a .keras file is a zip archive


def capability_file() -> Path:
    """The capability YAML shipped in this package."""
    return Path(str(resources.files("lpq_tf").joinpath("capabilities", "tf.yaml")))


def tf_distribution() -> str:
    """The installed distribution that provides TensorFlow (read from metadata only)."""
    for name in TF_DISTRIBUTIONS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return name
    return TF_DISTRIBUTIONS[0]


@lpq.hookimpl
def lpq_register_adaptors(register: Callable[[lpq.AdaptorInfo], None]) -> None:
    register(
        lpq.AdaptorInfo(
            framework=FRAMEWORK,
            framework_distribution=tf_distribution(),
            capability_files=[capability_file()],
            description="TensorFlow / Keras / LiteRT: full-integer int8, 16x8 and dynamic "
            "TFLite models run with ai-edge-litert, per-op float fallback",
            model_suffixes=(KERAS_SUFFIX, TFLITE_SUFFIX),
            install_hint="pip install lpq-tf",
        )
    )


@lpq.hookimpl
def lpq_register_backend_profiles(register: Callable[[lpq.BackendProfile], None]) -> None:
    register(
        lpq.BackendProfile(
            name="tflite-cpu",
            framework=FRAMEWORK,
            description="LiteRT on CPU (XNNPACK), float model inputs and outputs",
            options={"io_dtype": "float32"},
        )
    )
    register(
        lpq.BackendProfile(
            name="tflite-int8-io",
            framework=FRAMEWORK,
            description="integer-only model: int8 inputs and outputs too (microcontrollers, "
            "NPUs); lpq quantizes float data fed to it when evaluating",
            options={"io_dtype": "int8"},
        )
    )


def _file_kind(model: Any) -> str | None:
    """'tflite', 'keras' or 'saved_model' for a path to such a model, else None."""
    if not isinstance(model, str | Path):
        return None
    path = Path(model)
    try:
        if path.is_dir():
            has_pb = (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file()
            return "saved_model" if has_pb else None
        suffix = path.suffix.lower()
        if suffix not in (TFLITE_SUFFIX, KERAS_SUFFIX) or not path.is_file():
            return None
        with path.open("rb") as handle:
            head = handle.read(8)
    except OSError:
        return None
    if suffix == TFLITE_SUFFIX and head[4:8] == _TFLITE_IDENTIFIER:
        return "tflite"
    if suffix == KERAS_SUFFIX and head[:4] == _ZIP_MAGIC:
        return "keras"
    return None


def _is_keras_model(model: Any) -> bool:
    # A Keras model can only exist if keras is already imported: never import it here.
    keras = sys.modules.get("keras")
    if keras is None:
        return False
    try:
        return isinstance(model, keras.Model)
    except Exception:
        return False


@lpq.hookimpl
def lpq_detect_framework(model: Any) -> str | None:
    try:
        if type(model).__module__.startswith("lpq_tf."):
            return FRAMEWORK
        if _is_keras_model(model) or _file_kind(model) is not None:
            return FRAMEWORK
    except Exception:  # detection must never raise for foreign models
        return None
    return None


@lpq.hookimpl
def lpq_query_fw_capability(
    framework: str, model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> lpq.FrameworkCapability | None:
    if framework != FRAMEWORK:
        return None
    from .capability import build_capability
    from .model_io import prepare

    return build_capability(prepare(model), options)


@lpq.hookimpl
def lpq_quantize(
    framework: str,
    model: Any,
    tune_cfg: lpq.TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> Any | None:
    if framework != FRAMEWORK:
        return None
    if train_func is not None:
        raise lpq.ConfigError(
            "the tf adaptor does only post-training quantization",
            hint="train with quantization-aware training in Keras yourself, or use lpq-torch",
        )
    from .quantize import quantize

    return quantize(model, tune_cfg, calib_dataloader)


@lpq.hookimpl
def lpq_evaluate(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[lpq.Metric],
    measurer: lpq.LatencyMeasurer | None,
    iteration: int | None,
) -> lpq.EvalResult | None:
    if framework != FRAMEWORK:
        return None
    from .evaluate import evaluate

    return evaluate(model, dataloader, postprocess, metrics, measurer, iteration)


@lpq.hookimpl
def lpq_convert_bf16(
    framework: str, model: Any, op_names: Sequence[str], dtype: Literal["bf16", "fp16"]
) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .convert import convert

    return convert(model, op_names, dtype)


@lpq.hookimpl
def lpq_inspect_tensor(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: Literal["activation", "weight", "both"],
    iteration: int | None,
) -> lpq.Inspection | None:
    if framework != FRAMEWORK:
        return None
    from .inspection import inspect

    return inspect(model, dataloader, op_names, kind, iteration)


@lpq.hookimpl
def lpq_quantized_ops(framework: str, model: Any) -> dict[str, str] | None:
    if framework != FRAMEWORK:
        return None
    from .precision import quantized_ops

    return quantized_ops(model)


@lpq.hookimpl
def lpq_save_model(framework: str, model: Any, path: Path) -> Path | None:
    if framework != FRAMEWORK:
        return None
    from .persist import save

    return save(model, path)


@lpq.hookimpl
def lpq_load_model(framework: str, path: Path) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .persist import load

    return load(path)
