"""lpq hook implementations for ONNX Runtime (entry point ``onnxrt = "lpq_onnxrt.plugin:plugin"``).

Registration only. Importing this module, registering and detecting never import onnx or
onnxruntime (only :mod:`lpq_onnxrt.info`), so ``lpq plugins list`` stays fast. Each job
method imports its job module when called. :class:`lpq.AdaptorHooks` answers other
frameworks' calls with ``None``. Nothing in the package imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import lpq
from lpq import (
    AdaptorInfo,
    BackendProfile,
    Example,
    TuneConfig,
    lazy_job,
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

    query_capability = lazy_job("lpq_onnxrt.capability:query_capability")
    fused_patterns = lazy_job("lpq_onnxrt.capability:fused_patterns")

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

    evaluate = lazy_job("lpq_onnxrt.evaluate:evaluate")
    output_names = lazy_job("lpq_onnxrt.evaluate:output_names")
    cast_lowp = lazy_job("lpq_onnxrt.lowp:cast_lowp")
    inspect_tensor = lazy_job("lpq_onnxrt.inspection:inspect_tensor")
    quantized_ops = lazy_job("lpq_onnxrt.precision:quantized_ops")
    resolved_config = lazy_job("lpq_onnxrt.qmodel:resolved_config")
    set_tensor = lazy_job("lpq_onnxrt.edit:set_tensor")
    export = lazy_job("lpq_onnxrt.export:export")
    quantize_input = lazy_job("lpq_onnxrt.edit:quantize_input")
    save = lazy_job("lpq_onnxrt.persist:save")
    load = lazy_job("lpq_onnxrt.persist:load")


plugin = OnnxrtPlugin()
