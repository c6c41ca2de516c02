"""lpq: accuracy-aware low-precision quantization with framework adaptors as plugins.

This namespace is lpq's public API, for users and plugin authors alike. Importing it is
cheap and imports no deep-learning framework; heavier parts load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .capability import CapabilitySpec, FrameworkCapability, QuantCapability, TensorOptions
from .data import ArrayLoader, batch_size, load_npz, split_batch, take_samples
from .discovery import installed_version
from .errors import (
    CapabilityError,
    ConfigError,
    DataError,
    LpqError,
    ModelError,
    NoAdaptorError,
    PluginError,
    TuningError,
)
from .evaluation import EvalResult, Inspection, LatencyMeasurer, Metric, evaluate_batches
from .fileio import atomic_write, write_json
from .hookspecs import hookimpl
from .manager import PluginManager, get_plugin_manager
from .plugin_types import AdaptorInfo, BackendProfile, Example
from .tune_config import FLOAT_PRECISIONS, OpConfig, OpKey, TensorConfig, TuneConfig

if TYPE_CHECKING:
    from .capability_loader import load_capability, validate_capability_file
    from .config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion
    from .tuner import QuantizedModel, TuningResult, fit, quantize

_LAZY = {
    "load_capability": "capability_loader",
    "validate_capability_file": "capability_loader",
    "AccuracyCriterion": "config",
    "PostTrainingQuantConfig": "config",
    "TuningCriterion": "config",
    "QuantizedModel": "tuner",
    "TuningResult": "tuner",
    "fit": "tuner",
    "quantize": "tuner",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lpq' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"lpq.{module}"), name)


__all__ = [
    "FLOAT_PRECISIONS",
    "AccuracyCriterion",
    "AdaptorInfo",
    "ArrayLoader",
    "BackendProfile",
    "CapabilityError",
    "CapabilitySpec",
    "ConfigError",
    "DataError",
    "EvalResult",
    "Example",
    "FrameworkCapability",
    "Inspection",
    "LatencyMeasurer",
    "LpqError",
    "Metric",
    "ModelError",
    "NoAdaptorError",
    "OpConfig",
    "OpKey",
    "PluginError",
    "PluginManager",
    "PostTrainingQuantConfig",
    "QuantCapability",
    "QuantizedModel",
    "TensorConfig",
    "TensorOptions",
    "TuneConfig",
    "TuningCriterion",
    "TuningError",
    "TuningResult",
    "__version__",
    "atomic_write",
    "batch_size",
    "evaluate_batches",
    "fit",
    "get_plugin_manager",
    "hookimpl",
    "installed_version",
    "load_capability",
    "load_npz",
    "quantize",
    "split_batch",
    "take_samples",
    "validate_capability_file",
    "write_json",
]
