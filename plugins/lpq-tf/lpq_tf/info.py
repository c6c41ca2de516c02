"""What lpq knows about the TensorFlow adaptor before any framework is imported.

A leaf module: the framework name, the distributions that provide TensorFlow, the
capability file and the sniffing that recognises a TF model. It imports nothing of
``lpq_tf`` and never imports TensorFlow, Keras or LiteRT, so registration and detection
(``lpq plugins list``, ``lpq_detect_framework``) stay cheap; every other module may import
it.
"""

from __future__ import annotations

import sys
from importlib import metadata, resources
from pathlib import Path
from typing import Any

FRAMEWORK = "tf"
#: Distributions that provide the ``tensorflow`` package, in the order lpq looks for them.
#: TensorFlow comes under several names (a GPU machine may have ``tensorflow`` where
#: lpq-tf depends on ``tensorflow-cpu``), so the one installed is looked up, not assumed.
DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-intel", "tf-nightly")
#: The distribution lpq-tf depends on; the one reported when none is installed.
DISTRIBUTION = DISTRIBUTIONS[0]
KERAS_SUFFIX = ".keras"
TFLITE_SUFFIX = ".tflite"
_TFLITE_IDENTIFIER = b"TFL3"  # flatbuffer file identifier, bytes 4..8 of a .tflite
_ZIP_MAGIC = b"PK\x03\x04"  # a .keras file is a zip archive


def capability_files() -> list[Path]:
    """The capability YAML shipped in this package."""
    return [Path(str(resources.files("lpq_tf").joinpath("capabilities", "tf.yaml")))]


def installed_distribution() -> str:
    """The installed distribution that provides TensorFlow (read from metadata only)."""
    for name in DISTRIBUTIONS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return name
    return DISTRIBUTION


def file_kind(model: Any) -> str | None:
    """'tflite', 'keras' or 'saved_model' for a path to such a model, else None.

    Decided from the suffix and the first bytes (or ``saved_model.pb``), so a foreign file
    that merely carries one of our suffixes is declined without loading anything.
    """
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


def is_keras_model(model: Any) -> bool:
    """Whether ``model`` is a Keras model object, without importing Keras.

    A Keras model can only exist if keras is already imported, so ``sys.modules`` is
    asked instead of importing it.
    """
    keras = sys.modules.get("keras")
    if keras is None:
        return False
    try:
        return isinstance(model, keras.Model)
    except Exception:
        return False


def detect(model: Any) -> bool:
    """Whether ``model`` is the tf adaptor's: a Keras model, a TF model file or directory,
    or an object of this package (a quantized model). Never raises: detection is asked
    about every other framework's models too."""
    try:
        return (
            type(model).__module__.startswith("lpq_tf.")
            or is_keras_model(model)
            or file_kind(model) is not None
        )
    except Exception:
        return False
