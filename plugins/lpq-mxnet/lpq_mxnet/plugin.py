"""lpq hook implementations for MXNet (entry point ``mxnet = "lpq_mxnet.plugin:plugin"``).

Registration only. Importing this module, registering and detecting never import MXNet
(only :mod:`lpq_mxnet.info`), so ``lpq plugins list`` works and lists this plugin in an
environment without MXNet. Each job method imports its job module when called; those
import MXNet through :func:`lpq_mxnet.framework.mxnet`, which raises an lpq error saying
what to install when MXNet cannot be imported. :class:`lpq.AdaptorHooks` answers other
frameworks' calls with ``None``. Nothing in the package imports this module.
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

from . import info
from .info import FRAMEWORK


class MxnetPlugin(lpq.AdaptorHooks):
    """The MXNet adaptor: registration, and one method per job it offers."""

    framework = FRAMEWORK

    @lpq.hookimpl
    def lpq_register_adaptors(self, register: Callable[[AdaptorInfo], None]) -> None:
        register(
            AdaptorInfo(
                framework=FRAMEWORK,
                framework_distribution=info.DISTRIBUTION,
                capability_files=info.capability_files(),
                description=(
                    "MXNet Gluon HybridBlocks and exported symbol JSON + params, "
                    "oneDNN int8 via quantize_net_v2"
                ),
                model_suffixes=(info.SYMBOL_SUFFIX, info.PARAMS_SUFFIX),
                install_hint=info.INSTALL_HINT,
            )
        )

    def detect(self, model: Any) -> bool:
        return info.detect(model)

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

    def save(self, model: Any, path: Path) -> Path:
        from .persist import save

        return save(model, path)

    def load(self, path: Path) -> Any:
        from .persist import load

        return load(path)


plugin = MxnetPlugin()
