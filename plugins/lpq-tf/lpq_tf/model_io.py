"""The four model inputs, turned into one prepared form: a float ``.tflite`` and its names.

* a Keras 3 model object, or a ``.keras`` file (loaded with ``safe_mode``),
* a SavedModel directory,
* a float ``.tflite`` file.

Keras models are exported with ``model.export(dir)`` and converted with
``TFLiteConverter.from_saved_model``, the path TensorFlow maintains (``from_keras_model``
dumps a SavedModel to stdout, ``from_concrete_functions`` makes Keras 3 models that fail
at run time). The float ``.tflite`` is what lpq lists ops from, what the fp32 baseline
runs in LiteRT, and what ai-edge-quantizer quantizes. A prepared model is kept in the
run cache (``lpq.run_cache()``, per model object and weights, or per file and mtime), so
a tuning run converts once and the conversion is released when the run ends.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lpq
from lpq import ModelError

from . import graph as graph_mod
from .info import file_kind, is_keras_model
from .naming import op_names
from .qmodel import QuantizedModel
from .tfenv import import_tf, quietly

_SUPPORTED = "a Keras model, a .keras file, a SavedModel directory or a float .tflite file"


@dataclass
class Prepared:
    """A model ready for the converter and LiteRT, with lpq's op names."""

    kind: str  # "keras", "saved_model" or "tflite"
    source: str
    float_tflite: bytes
    saved_model_dir: Path | None
    keras_model: Any | None = None
    #: Results computed once per model: calibrated models, AEQ calibration, ...
    cache: dict[Any, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.graph = graph_mod.read(self.float_tflite)
        self.names = op_names(self.graph, _layers(self.keras_model))

    def ops(self) -> list[tuple[str, str, str]]:
        """``(lpq name, op type, TFLite output tensor name)`` of every op, in order."""
        return [
            (self.names[op.index], op.op_type, self.graph.output_name(op))
            for op in self.graph.model_ops()
        ]


def _layers(model: Any) -> list[tuple[str, str]]:
    """Every layer of a Keras model, nested models flattened, in model order."""
    if model is None:
        return []
    found: list[tuple[str, str]] = []
    for layer in getattr(model, "layers", []):
        if getattr(layer, "layers", None):
            found.extend(_layers(layer))
        else:
            found.append((layer.name, type(layer).__name__))
    return found


def _weights_key(model: Any) -> str:
    """A cheap fingerprint of the weights: shapes plus about 4k values of each, so that a
    retrained model is converted again while every hook call of a run stays fast."""
    digest = hashlib.blake2b(digest_size=16)
    for weight in model.weights:
        value = weight.numpy()
        digest.update(str(value.shape).encode())
        digest.update(value.ravel()[:: max(1, value.size // 4096)].tobytes())
    return digest.hexdigest()


def _scratch_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="lpq-tf-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def run_converter(saved_model_dir: Path, configure: Any = None) -> bytes:
    """Run ``TFLiteConverter.from_saved_model``; ``configure(converter)`` sets options.

    A conversion error becomes a :class:`lpq.ModelError` naming the op the converter
    rejected and what can be done about it.
    """
    tf = import_tf()

    def run() -> bytes:
        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir))
        if configure is not None:
            configure(converter)
        return bytes(converter.convert())

    return quietly(run, converter_error)


def converter_error(exc: Exception, log: str) -> ModelError:
    """A ModelError for a failed conversion: the rejected op and what helps."""
    import re

    text = f"{exc}\n{log}"
    ops = sorted(set(re.findall(r"'(tf\.[A-Za-z0-9_]+)' op", text)))
    if ops:
        return ModelError(
            f"the TFLite converter rejected op(s) {', '.join(ops)}: no TFLite builtin kernel",
            hint="replace these ops in the model (SELECT_TF_OPS would convert them, but the "
            "model would then need TensorFlow's Flex delegate, which ai-edge-litert does not "
            "ship; a per-op fp32 fallback does not help, the float model fails too)",
        )
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return ModelError(
        f"the TFLite converter failed: {first}",
        hint="the converter's last log lines follow (LPQ_TF_VERBOSE=1 shows all of it)"
        + (f"\n{log}" if log else ""),
    )


def _from_keras(model: Any, source: str) -> Prepared:
    if not getattr(model, "built", True) or not getattr(model, "inputs", True):
        raise ModelError(
            f"{source}: the Keras model is not built, so it has no input signature",
            hint="call the model on a batch (or build it with an Input) before quantizing",
        )
    directory = _scratch_dir() / "saved_model"
    import_tf()
    quietly(
        lambda: model.export(str(directory), format="tf_saved_model", verbose=False),
        lambda exc, log: ModelError(
            f"{source}: Keras could not export the model as a SavedModel ({exc})",
            hint="the model must be traceable with tf.function\n" + log,
        ),
    )
    return Prepared("keras", source, run_converter(directory), directory, model)


def _load_keras_file(path: Path) -> Any:
    import_tf()
    import keras

    try:
        return keras.saving.load_model(str(path), compile=False, safe_mode=True)
    except Exception as exc:
        raise ModelError(
            f"{path}: cannot load the .keras file ({type(exc).__name__}: {exc})".splitlines()[0],
            hint="custom layers must be registered (keras.saving.register_keras_serializable); "
            "lpq loads with safe_mode and never runs pickled lambdas",
        ) from None


def prepare(model: Any) -> Prepared:
    """The prepared form of any supported input (cached); ModelError for anything else."""
    if isinstance(model, Prepared):
        return model
    if isinstance(model, QuantizedModel):
        if model.source is not None:
            return model.source
        raise ModelError(
            "this quantized model was loaded from a file and has no fp32 model attached",
            hint="pass the fp32 model (Keras, SavedModel or float .tflite) instead",
        )
    if is_keras_model(model):
        key: tuple[Any, ...] = ("keras", id(model), _weights_key(model))
        return _cached(key, lambda: _from_keras(model, f"Keras model {model.name!r}"))
    kind = file_kind(model)
    if kind is None:
        if isinstance(model, str | Path) and not Path(model).exists():
            raise ModelError(f"{model}: no such file or directory")
        raise ModelError(
            f"not a TensorFlow model: {type(model).__name__} {str(model)[:80]!r}",
            hint=f"the tf adaptor takes {_SUPPORTED}",
        )
    path = Path(model).resolve()
    stat = path.stat()
    key = (kind, str(path), stat.st_mtime_ns, stat.st_size)
    if kind == "tflite":
        return _cached(key, lambda: _from_tflite(path))
    if kind == "saved_model":
        return _cached(key, lambda: Prepared("saved_model", str(path), run_converter(path), path))
    return _cached(key, lambda: _from_keras(_load_keras_file(path), str(path)))


def _from_tflite(path: Path) -> Prepared:
    content = path.read_bytes()
    parsed = graph_mod.read(content)
    if "lpq.tune_cfg" in parsed.metadata:
        raise ModelError(
            f"{path}: this .tflite was already quantized by lpq",
            hint="quantize the fp32 model it came from",
        )
    return Prepared("tflite", str(path), graph_mod.normalize(content), None)


def _cached(key: tuple[Any, ...], make: Any) -> Prepared:
    prepared: Prepared = lpq.run_cache().get_or_compute("tf-prepared", lpq.content_key(key), make)
    return prepared
