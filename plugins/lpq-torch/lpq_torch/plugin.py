"""lpq hook implementations for PyTorch (entry point ``torch = "lpq_torch.plugin:plugin"``).

Registration only. :class:`TorchPlugin` describes the adaptor (``lpq_register_*``) and
binds each job lpq-torch offers to lpq's per-framework hook through
:class:`lpq.AdaptorHooks`, which declines every other framework. Each job method imports
its module when first called: importing this module, registering and detecting never
import torch, so ``lpq plugins list`` stays fast. Nothing in the package imports this
module; it sits on top of every job module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import lpq
from lpq import (
    AdaptorInfo,
    EvalResult,
    FrameworkCapability,
    Inspection,
    LatencyMeasurer,
    Metric,
    TuneConfig,
)

from .info import DISTRIBUTION, FRAMEWORK, MODEL_SUFFIX, capability_files, detect


class TorchPlugin(lpq.AdaptorHooks):
    """The PyTorch adaptor: registration hooks and the jobs it implements."""

    framework = FRAMEWORK

    @lpq.hookimpl
    def lpq_register_adaptors(self, register: Callable[[AdaptorInfo], None]) -> None:
        register(
            AdaptorInfo(
                framework=FRAMEWORK,
                framework_distribution=DISTRIBUTION,
                capability_files=capability_files(),
                description="PyTorch nn.Module via torch.export + PT2E (torchao), x86 int8",
                model_suffixes=(MODEL_SUFFIX,),
                install_hint="pip install lpq-torch",
            )
        )

    @lpq.hookimpl
    def lpq_register_backend_profiles(self, register: Callable[[lpq.BackendProfile], None]) -> None:
        from .backends.profiles import register_all  # plain data: no torch import

        register_all(register)

    def detect(self, model: Any) -> bool:
        return detect(model)

    def query_capability(
        self, model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
    ) -> FrameworkCapability:
        from .capability import query_capability

        return query_capability(model, dataloader, options)

    def fused_patterns(self, model: Any) -> list[tuple[str, ...]]:
        from .capability import fused_patterns

        return fused_patterns(model)

    def quantize(
        self,
        model: Any,
        tune_cfg: TuneConfig,
        calib_dataloader: Iterable[Any] | None,
        train_func: Callable[[Any], Any] | None,
    ) -> Any:
        from .quantize import quantize

        return quantize(model, tune_cfg, calib_dataloader, train_func)

    def evaluate(
        self,
        model: Any,
        dataloader: Iterable[Any],
        postprocess: Any,
        metrics: Sequence[Metric],
        measurer: LatencyMeasurer | None,
        iteration: int | None,
    ) -> EvalResult:
        from .evaluate import evaluate

        return evaluate(model, dataloader, postprocess, metrics, measurer, iteration)

    def cast_lowp(self, model: Any, op_names: Sequence[str], dtype: Literal["bf16", "fp16"]) -> Any:
        from .lowp import cast_lowp

        return cast_lowp(model, op_names, dtype)

    def inspect_tensor(
        self,
        model: Any,
        dataloader: Iterable[Any],
        op_names: Sequence[str] | None,
        kind: Literal["activation", "weight", "both"],
        iteration: int | None,
    ) -> Inspection:
        from .inspection import inspect_tensor

        return inspect_tensor(model, dataloader, op_names, kind, iteration)

    def quantized_ops(self, model: Any) -> dict[str, str]:
        from .precision import quantized_ops

        return quantized_ops(model)

    def export(self, model: Any, target: str, options: dict[str, Any]) -> Any:
        from .export import export

        return export(model, target, options)

    def set_tensor(self, model: Any, tensor_name: str, value: Any) -> Any:
        from .edit import set_tensor

        return set_tensor(model, tensor_name, value)

    def quantize_input(self, model: Any, options: dict[str, Any]) -> Any:
        from .edit import quantize_input

        return quantize_input(model, options)

    def save(self, model: Any, path: Path) -> Path:
        from .persist import save

        return save(model, path)

    def load(self, path: Path) -> Any:
        from .persist import load

        return load(path)


plugin = TorchPlugin()
