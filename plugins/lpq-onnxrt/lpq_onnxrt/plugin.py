"""lpq hook implementations for ONNX Runtime (entry point ``onnxrt = "lpq_onnxrt.plugin:plugin"``).

Registration only. Importing this module, registering and detecting never import onnx or
onnxruntime (only :mod:`lpq_onnxrt.info`), so ``lpq plugins list`` stays fast. Each job
method imports its job module when called. :class:`lpq.AdaptorHooks` answers other
frameworks' calls with ``None``. Nothing in the package imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import lpq
from lpq import (
    AdaptorInfo,
    BackendProfile,
    EvalResult,
    Example,
    FrameworkCapability,
    Inspection,
    LatencyMeasurer,
    Metric,
    TuneConfig,
)

from . import info
from .info import FRAMEWORK


class OnnxrtPlugin(lpq.AdaptorHooks):
    """The ONNX Runtime adaptor: registration, and one method per job it offers."""

    framework = FRAMEWORK

    @lpq.hookimpl
    def lpq_register_adaptors(self, register: Callable[[AdaptorInfo], None]) -> None:
        register(
            AdaptorInfo(
                framework=FRAMEWORK,
                framework_distribution=info.DISTRIBUTION,
                capability_files=info.capability_files(),
                description="ONNX Runtime (CPU): static QDQ/QOperator int8, dynamic int8, "
                "int4 weight-only MatMul, fp16 fallback",
                model_suffixes=info.MODEL_SUFFIXES,
                install_hint=info.INSTALL_HINT,
                known_options=info.KNOWN_OPTIONS,
            )
        )

    @lpq.hookimpl
    def lpq_register_backend_profiles(self, register: Callable[[BackendProfile], None]) -> None:
        register(
            BackendProfile(
                name="onnxrt-cpu",
                framework=FRAMEWORK,
                description="x86 CPU, latency-aware: U8S8 int8 where measured faster than fp32 "
                "on this machine, in the faster of QDQ and QOperator",
                options={"latency_aware": True, "providers": ["CPUExecutionProvider"]},
            )
        )
        register(
            BackendProfile(
                name="onnxrt-cpu-qoperator",
                framework=FRAMEWORK,
                description="x86 CPU: QOperator format (QLinearConv, QLinearMatMul) for "
                "runtimes that do not fuse QDQ",
                options={"quant_format": "qoperator", "providers": ["CPUExecutionProvider"]},
            )
        )
        register(
            BackendProfile(
                name="onnxrt-cpu-avx2",
                framework=FRAMEWORK,
                description="x86 CPU without VNNI (AVX2/AVX-512F): 7-bit weights "
                "(reduce_range), since u8 x s8 multiply-adds saturate in int16 there",
                options={"providers": ["CPUExecutionProvider"]},
                scheme={
                    "weight": {"dtype": "int8", "granularity": "per_channel", "reduce_range": True},
                    "activation": {"dtype": "uint8", "symmetric": False},
                    "placement": "inputs",
                },
            )
        )

    @lpq.hookimpl
    def lpq_register_examples(self, register: Callable[[Example], None]) -> None:
        from .examples import digits_example

        files = digits_example()
        register(
            Example(
                name="digits",
                framework=FRAMEWORK,
                model=files["model"],
                calib=files["calib"],
                eval=files["eval"],
                metric=files["metric"],
                description="a small CNN on scikit-learn's 8x8 digits (ONNX, 98% top-1 in fp32)",
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
    ) -> lpq.QuantizeResult:
        """The quantized model with its per-op precisions and resolved config, read once
        here so a trial needs no further hook call for them."""
        from .precision import quantized_ops
        from .qmodel import resolved_config
        from .quantize import quantize

        quantized = quantize(model, tune_cfg, calib_dataloader, train_func)
        return lpq.QuantizeResult(
            quantized,
            quantized_ops=quantized_ops(quantized),
            tune_cfg=resolved_config(quantized),
        )

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

    def resolved_config(self, model: Any) -> TuneConfig | None:
        from .qmodel import resolved_config

        return resolved_config(model)

    def set_tensor(self, model: Any, tensor_name: str, value: Any) -> Any:
        from .edit import set_tensor

        return set_tensor(model, tensor_name, value)

    def export(self, model: Any, target: str, options: dict[str, Any]) -> Any:
        from .export import export

        return export(model, target, options)

    def quantize_input(self, model: Any, options: dict[str, Any]) -> Any:
        from .edit import quantize_input

        return quantize_input(model, options)

    def save(self, model: Any, path: Path) -> Path:
        from .persist import save

        return save(model, path)

    def load(self, path: Path) -> Any:
        from .persist import load

        return load(path)


plugin = OnnxrtPlugin()
