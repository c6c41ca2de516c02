"""lpq: accuracy-aware low-precision quantization with framework adaptors as plugins.

This namespace is lpq's public API, for users and plugin authors alike. Importing it is
cheap and imports no deep-learning framework; heavier parts load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .cache import RunCache, content_key, run_cache
from .errors import (
    CapabilityError,
    ConfigError,
    DataError,
    LpqDeprecationWarning,
    LpqError,
    LpqWarning,
    ModelError,
    NoAdaptorError,
    PluginError,
    TuningError,
)
from .eval.data import (
    ArrayLoader,
    OutputRecorder,
    batch_size,
    load_npz,
    split_batch,
    take_samples,
)
from .eval.evaluation import EvalResult, Inspection, LatencyMeasurer, Metric, evaluate_batches
from .eval.runtimes import kept_runtime, runtimes_kept
from .fileio import atomic_write, write_json
from .hookspecs import hookimpl
from .plan.capability import CapabilitySpec, FrameworkCapability, QuantCapability, TensorOptions
from .plan.tune_config import FLOAT_PRECISIONS, OpConfig, OpKey, TensorConfig, TuneConfig
from .plugins.adaptor_hooks import AdaptorHooks, lazy_job
from .plugins.discovery import installed_version
from .plugins.manager import PluginManager, get_plugin_manager
from .plugins.types import AdaptorInfo, BackendProfile, Example, QuantizeResult
from .tuning.gate import exclusive_timing

if TYPE_CHECKING:
    from .api import QuantizedModel, TuningResult, fit, quantize
    from .config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion
    from .deployment import DeployResult, deploy
    from .eval.metrics import F1, MSE, Agreement, CosineSimilarity, TopK
    from .hardware import CpuFeatures, cpu_features
    from .plan.backend import QuantScheme, RuledOut, TensorScheme
    from .plan.capability_loader import load_capability, validate_capability_file
    from .plan.tuning_space import TuningSpace
    from .strategy import (
        Candidate,
        Proposals,
        StopTuning,
        Strategy,
        TuningContext,
        accuracy_gain,
        fall_back,
        improves,
        one,
        probe_op_by_op,
        ranked,
        requantize,
        runs_quantized,
    )
    from .tuning.executors import Executor, TrialOutcome
    from .tuning.records import TrialRecord
    from .tuning.runner import TrialRunner, TrialSpec

# Heavier parts load on first use: importing lpq stays cheap and framework-free.
_LAZY = {
    "load_capability": "plan.capability_loader",
    "validate_capability_file": "plan.capability_loader",
    "TuningSpace": "plan.tuning_space",
    "CpuFeatures": "hardware",
    "cpu_features": "hardware",
    "QuantScheme": "plan.backend",
    "TensorScheme": "plan.backend",
    "RuledOut": "plan.backend",
    "deploy": "deployment",
    "DeployResult": "deployment",
    "AccuracyCriterion": "config",
    "PostTrainingQuantConfig": "config",
    "TuningCriterion": "config",
    "QuantizedModel": "api",
    "TuningResult": "api",
    "fit": "api",
    "quantize": "api",
    "TopK": "eval.metrics",
    "Agreement": "eval.metrics",
    "MSE": "eval.metrics",
    "CosineSimilarity": "eval.metrics",
    "F1": "eval.metrics",
    "Strategy": "strategy",
    "TuningContext": "strategy",
    "StopTuning": "strategy",
    "Candidate": "strategy",
    "Proposals": "strategy",
    "one": "strategy",
    "fall_back": "strategy",
    "requantize": "strategy",
    "improves": "strategy",
    "accuracy_gain": "strategy",
    "probe_op_by_op": "strategy",
    "runs_quantized": "strategy",
    "ranked": "strategy",
    "TrialRecord": "tuning.records",
    "TrialSpec": "tuning.runner",
    "TrialRunner": "tuning.runner",
    "Executor": "tuning.executors",
    "TrialOutcome": "tuning.executors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lpq' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"lpq.{module}"), name)


__all__ = [
    "F1",
    "FLOAT_PRECISIONS",
    "MSE",
    "AccuracyCriterion",
    "AdaptorHooks",
    "AdaptorInfo",
    "Agreement",
    "ArrayLoader",
    "BackendProfile",
    "Candidate",
    "CapabilityError",
    "CapabilitySpec",
    "ConfigError",
    "CosineSimilarity",
    "CpuFeatures",
    "DataError",
    "DeployResult",
    "EvalResult",
    "Example",
    "Executor",
    "FrameworkCapability",
    "Inspection",
    "LatencyMeasurer",
    "LpqDeprecationWarning",
    "LpqError",
    "LpqWarning",
    "Metric",
    "ModelError",
    "NoAdaptorError",
    "OpConfig",
    "OpKey",
    "OutputRecorder",
    "PluginError",
    "PluginManager",
    "PostTrainingQuantConfig",
    "Proposals",
    "QuantCapability",
    "QuantScheme",
    "QuantizeResult",
    "QuantizedModel",
    "RuledOut",
    "RunCache",
    "StopTuning",
    "Strategy",
    "TensorConfig",
    "TensorOptions",
    "TensorScheme",
    "TopK",
    "TrialOutcome",
    "TrialRecord",
    "TrialRunner",
    "TrialSpec",
    "TuneConfig",
    "TuningContext",
    "TuningCriterion",
    "TuningError",
    "TuningResult",
    "TuningSpace",
    "__version__",
    "accuracy_gain",
    "atomic_write",
    "batch_size",
    "content_key",
    "cpu_features",
    "deploy",
    "evaluate_batches",
    "exclusive_timing",
    "fall_back",
    "fit",
    "get_plugin_manager",
    "hookimpl",
    "improves",
    "installed_version",
    "kept_runtime",
    "lazy_job",
    "load_capability",
    "load_npz",
    "one",
    "probe_op_by_op",
    "quantize",
    "ranked",
    "requantize",
    "run_cache",
    "runs_quantized",
    "runtimes_kept",
    "split_batch",
    "take_samples",
    "validate_capability_file",
    "write_json",
]
