"""What lpq knows about the ONNX Runtime adaptor before onnx or onnxruntime is imported.

A leaf module: the framework name, the distribution that provides the runtime, the
capability file and the sniffing that recognises an ONNX model. It imports nothing of
``lpq_onnxrt`` and never imports onnx, so registration and detection (``lpq plugins
list``, ``lpq_detect_framework``) stay cheap; every other module may import it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FRAMEWORK = "onnxrt"
#: The distribution that provides ``onnxruntime`` (its version selects capability entries).
DISTRIBUTION = "onnxruntime"
INSTALL_HINT = "pip install lpq-onnxrt"
MODEL_SUFFIXES = (".onnx",)
#: The module of :class:`lpq_onnxrt.qmodel.QuantizedModel`, named rather than imported.
_QMODEL_MODULE = "lpq_onnxrt.qmodel"
# First byte of a serialized ModelProto: the tag of one of its fields (ir_version first
# in files written by onnx; other fields when it is missing).
_PROTO_FIRST_BYTES = frozenset({0x08, 0x12, 0x1A, 0x22, 0x2A, 0x32, 0x3A, 0x42, 0x4A, 0x52, 0x5A})


def capability_files() -> list[Path]:
    """The capability YAML shipped in this package."""
    return [Path(__file__).resolve().parent / "capabilities" / "onnxrt.yaml"]


def is_onnx_model(model: Any) -> bool:
    """True for ``onnx.ModelProto`` objects, checked without importing onnx."""
    cls = type(model)
    return cls.__name__ == "ModelProto" and cls.__module__.startswith("onnx")


def looks_like_onnx_file(model: Any) -> bool:
    """True for the path of an ``.onnx`` file whose first byte can start a ModelProto."""
    if not isinstance(model, str | os.PathLike):
        return False
    file = Path(model)
    if file.suffix.lower() not in MODEL_SUFFIXES:
        return False
    try:
        with file.open("rb") as handle:
            first = handle.read(1)
    except OSError:
        return False
    return bool(first) and first[0] in _PROTO_FIRST_BYTES


def detect(model: Any) -> bool:
    """True for an ``onnx.ModelProto``, a model lpq-onnxrt quantized and an ONNX file.

    Cheap and never raises: objects are recognised by their class's name and module (so
    onnx is never imported for a foreign model), files by suffix and first byte.
    """
    try:
        if is_onnx_model(model) or type(model).__module__ == _QMODEL_MODULE:
            return True
        return looks_like_onnx_file(model)
    except Exception:  # detection must never raise for a foreign model
        return False


#: Every global option key lpq-onnxrt reads (``--option KEY=VALUE``): quantization,
#: latency-aware decisions, the recipes of its capability YAML, and ORT session settings.
KNOWN_OPTIONS = (
    "quant_format",
    "latency_aware",
    "latency_margin",
    "latency_cache_dir",
    "latency_budget_s",
    "latency_batch_size",
    "dynamic_weights",
    "concat_max_spread",
    "accuracy_level",
    # weight-only (lpq_onnxrt.passes.weight_only)
    "lm_head",
    "lm_head_min_agreement",
    "lm_head_max_kl",
    "embedding",
    "gptq_damp",
    "gptq_act_order",
    "awq_grid",
    "awq_tokens",
    "calib_budget_mb",
    "calibration_memory_mb",
    "capability_file",
    "activation_range_scales",
    "cross_layer_equalization",
    "smoothquant",
    "bias_correction",
    "adaround",
    "threads",
    "intra_op_num_threads",
    "inter_op_num_threads",
    "graph_optimization_level",
    "enable_profiling",
    "optimized_model_filepath",
    "providers",
    "execution_provider",
)
