"""Framework dispatch written once: an adaptor's jobs bound to lpq's per-framework hooks.

Per-framework hooks are dispatched first-result: every implementation must return
``None`` for a framework that is not its own. Written by hand that is one
``if framework != FRAMEWORK: return None`` per hook per adaptor. :class:`AdaptorHooks`
does it once: an adaptor subclasses it, names its ``framework`` and defines the job
methods it offers (``quantize``, ``evaluate``, ...); each defined job becomes the matching
``lpq_*`` hook implementation, and a job it leaves out stays unimplemented, so lpq's
checks for optional hooks still see what the adaptor really offers.

Module-level ``@lpq.hookimpl`` functions keep working: this is a convenience for adaptor
authors, not a second contract.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from ..eval.evaluation import EvalResult, Inspection, LatencyMeasurer, Metric, Postprocess
from ..hookspecs import hookimpl
from ..plan.capability import FrameworkCapability
from ..plan.tune_config import TuneConfig

# The hook each job method implements; the hook's other parameters are the method's.
JOB_HOOKS: dict[str, str] = {
    "detect": "lpq_detect_framework",
    "query_capability": "lpq_query_fw_capability",
    "fused_patterns": "lpq_query_fused_patterns",
    "quantize": "lpq_quantize",
    "evaluate": "lpq_evaluate",
    "cast_lowp": "lpq_convert_bf16",
    "inspect_tensor": "lpq_inspect_tensor",
    "quantized_ops": "lpq_quantized_ops",
    "resolved_config": "lpq_resolved_config",
    "output_names": "lpq_output_names",
    "set_tensor": "lpq_set_tensor",
    "export": "lpq_convert",
    "quantize_input": "lpq_quantize_input",
    "save": "lpq_save_model",
    "load": "lpq_load_model",
}


def lazy_job(target: str) -> Callable[..., Any]:
    """A job method that imports ``"package.module:function"`` on its first call and passes
    its arguments on, so an adaptor's ``plugin.py`` stays a table and importing it imports
    no framework::

        class OnnxrtPlugin(lpq.AdaptorHooks):
            framework = "onnxrt"
            evaluate = lpq.lazy_job("lpq_onnxrt.evaluate:evaluate")

    The function takes the job's parameters in the hook's order (the hook's minus
    ``framework``).
    """
    module_name, _, function_name = target.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"lazy_job wants 'package.module:function', not {target!r}")

    def job(self: Any, *args: Any) -> Any:
        return getattr(importlib.import_module(module_name), function_name)(*args)

    job.__doc__ = f"Runs {target} (imported on first use)."
    job.__qualname__ = job.__name__ = function_name
    return job


class AdaptorHooks:
    """Base class for an adaptor's hook implementations, dispatched on ``framework``.

    Subclass it, set ``framework`` and define the jobs the adaptor offers, with the hook's
    parameters minus ``framework`` (see :mod:`lpq.hookspecs` for each one's contract)::

        class OnnxrtHooks(lpq.AdaptorHooks):
            framework = "onnxrt"

            def quantize(self, model, tune_cfg, calib_dataloader, train_func):
                from .quantize import quantize
                return quantize(model, tune_cfg, calib_dataloader)

    Register an instance as the entry point (``onnxrt = "lpq_onnxrt.plugin:plugin"``).
    Registration hooks (``lpq_register_*``) are ordinary ``@lpq.hookimpl`` methods of the
    same class. ``detect(model) -> bool`` answers ``lpq_detect_framework``.
    """

    framework: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for job, hook_name in JOB_HOOKS.items():
            if callable(getattr(cls, job, None)):
                setattr(cls, hook_name, hookimpl(_DISPATCHERS[hook_name]))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} framework={getattr(self, 'framework', '?')!r}>"


# One dispatcher per hook, each with the hook's exact signature (pluggy passes arguments
# by the implementation's parameter names): decline a foreign framework, else call the job.


def _detect(self: Any, model: Any) -> str | None:
    try:
        return str(self.framework) if self.detect(model) else None
    except Exception:  # detection must never raise for a foreign model
        return None


def _query_capability(
    self: Any, framework: str, model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> FrameworkCapability | None:
    if framework != self.framework:
        return None
    result: FrameworkCapability = self.query_capability(model, dataloader, options)
    return result


def _fused_patterns(self: Any, framework: str, model: Any) -> list[tuple[str, ...]] | None:
    if framework != self.framework:
        return None
    return list(self.fused_patterns(model))


def _quantize(
    self: Any,
    framework: str,
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> Any | None:
    if framework != self.framework:
        return None
    return self.quantize(model, tune_cfg, calib_dataloader, train_func)


def _evaluate(
    self: Any,
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Postprocess | None,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult | None:
    if framework != self.framework:
        return None
    result: EvalResult = self.evaluate(model, dataloader, postprocess, metrics, measurer, iteration)
    return result


def _cast_lowp(
    self: Any, framework: str, model: Any, op_names: Sequence[str], dtype: Literal["bf16", "fp16"]
) -> Any | None:
    if framework != self.framework:
        return None
    return self.cast_lowp(model, op_names, dtype)


def _inspect_tensor(
    self: Any,
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: Literal["activation", "weight", "both"],
    iteration: int | None,
) -> Inspection | None:
    if framework != self.framework:
        return None
    result: Inspection = self.inspect_tensor(model, dataloader, op_names, kind, iteration)
    return result


def _quantized_ops(self: Any, framework: str, model: Any) -> dict[str, str] | None:
    if framework != self.framework:
        return None
    result: dict[str, str] | None = self.quantized_ops(model)
    return result


def _resolved_config(self: Any, framework: str, model: Any) -> TuneConfig | None:
    if framework != self.framework:
        return None
    result: TuneConfig | None = self.resolved_config(model)
    return result


def _output_names(self: Any, framework: str, model: Any) -> list[str] | None:
    if framework != self.framework:
        return None
    result: list[str] | None = self.output_names(model)
    return result


def _set_tensor(self: Any, framework: str, model: Any, tensor_name: str, value: Any) -> Any | None:
    if framework != self.framework:
        return None
    return self.set_tensor(model, tensor_name, value)


def _export(
    self: Any, framework: str, model: Any, target: str, options: dict[str, Any]
) -> Any | None:
    if framework != self.framework:
        return None
    return self.export(model, target, options)


def _quantize_input(self: Any, framework: str, model: Any, options: dict[str, Any]) -> Any | None:
    if framework != self.framework:
        return None
    return self.quantize_input(model, options)


def _save(self: Any, framework: str, model: Any, path: Path) -> Path | None:
    if framework != self.framework:
        return None
    result: Path = self.save(model, path)
    return result


def _load(self: Any, framework: str, path: Path) -> Any | None:
    if framework != self.framework:
        return None
    return self.load(path)


_DISPATCHERS: dict[str, Callable[..., Any]] = {
    "lpq_detect_framework": _detect,
    "lpq_query_fw_capability": _query_capability,
    "lpq_query_fused_patterns": _fused_patterns,
    "lpq_quantize": _quantize,
    "lpq_evaluate": _evaluate,
    "lpq_convert_bf16": _cast_lowp,
    "lpq_inspect_tensor": _inspect_tensor,
    "lpq_quantized_ops": _quantized_ops,
    "lpq_resolved_config": _resolved_config,
    "lpq_output_names": _output_names,
    "lpq_set_tensor": _set_tensor,
    "lpq_convert": _export,
    "lpq_quantize_input": _quantize_input,
    "lpq_save_model": _save,
    "lpq_load_model": _load,
}
