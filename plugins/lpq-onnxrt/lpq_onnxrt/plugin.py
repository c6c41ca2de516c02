"""The lpq hook implementations of the ONNX Runtime adaptor (entry point ``onnxrt``).

Kept tiny on purpose: registration hooks only describe the adaptor, and per-framework
hooks return ``None`` for other frameworks and otherwise delegate to modules that import
onnx / onnxruntime lazily. Importing this module imports neither, so ``lpq plugins list``
stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import lpq

FRAMEWORK = "onnxrt"
# First byte of a serialized ModelProto: the tag of one of its fields (ir_version first
# in files written by onnx; other fields when it is missing).
_PROTO_FIRST_BYTES = frozenset({0x08, 0x12, 0x1A, 0x22, 0x2A, 0x32, 0x3A, 0x42, 0x4A, 0x52, 0x5A})


def _capability_files() -> list[Path]:
    return [Path(__file__).resolve().parent / "capabilities" / "onnxrt.yaml"]


@lpq.hookimpl
def lpq_register_adaptors(register: Callable[[lpq.AdaptorInfo], None]) -> None:
    register(
        lpq.AdaptorInfo(
            framework=FRAMEWORK,
            framework_distribution="onnxruntime",
            capability_files=_capability_files(),
            description="ONNX Runtime (CPU): static QDQ/QOperator int8, dynamic int8, "
            "int4 weight-only MatMul, fp16 fallback",
            model_suffixes=(".onnx",),
            install_hint="pip install lpq-onnxrt",
        )
    )


@lpq.hookimpl
def lpq_register_backend_profiles(register: Callable[[lpq.BackendProfile], None]) -> None:
    register(
        lpq.BackendProfile(
            name="onnxrt-cpu",
            framework=FRAMEWORK,
            description="x86 CPU, latency-aware: U8S8 int8 where measured faster than fp32 on "
            "this machine, in the faster of QDQ and QOperator",
            options={"latency_aware": True, "providers": ["CPUExecutionProvider"]},
        )
    )
    register(
        lpq.BackendProfile(
            name="onnxrt-cpu-qoperator",
            framework=FRAMEWORK,
            description="x86 CPU: QOperator format (QLinearConv, QLinearMatMul) for runtimes "
            "that do not fuse QDQ",
            options={"quant_format": "qoperator", "providers": ["CPUExecutionProvider"]},
        )
    )
    register(
        lpq.BackendProfile(
            name="onnxrt-cpu-avx2",
            framework=FRAMEWORK,
            description="x86 CPU without VNNI (AVX2/AVX-512F): 7-bit weights (reduce_range), "
            "since u8 x s8 multiply-adds saturate in int16 there",
            options={"providers": ["CPUExecutionProvider"]},
            scheme={
                "weight": {"dtype": "int8", "granularity": "per_channel", "reduce_range": True},
                "activation": {"dtype": "uint8", "symmetric": False},
                "placement": "inputs",
            },
        )
    )


@lpq.hookimpl
def lpq_register_examples(register: Callable[[lpq.Example], None]) -> None:
    from .examples import digits_example

    files = digits_example()
    register(
        lpq.Example(
            name="digits",
            framework=FRAMEWORK,
            model=files["model"],
            calib=files["calib"],
            eval=files["eval"],
            metric=files["metric"],
            description="a small CNN on scikit-learn's 8x8 digits (ONNX, 98% top-1 in fp32)",
        )
    )


def _looks_like_onnx_file(model: Any) -> bool:
    if not isinstance(model, str | os.PathLike):
        return False
    file = Path(model)
    if file.suffix.lower() != ".onnx":
        return False
    try:
        with file.open("rb") as handle:
            first = handle.read(1)
    except OSError:
        return False
    return bool(first) and first[0] in _PROTO_FIRST_BYTES


@lpq.hookimpl
def lpq_detect_framework(model: Any) -> str | None:
    try:
        cls = type(model)
        if cls.__name__ == "ModelProto" and cls.__module__.startswith("onnx"):
            return FRAMEWORK
        if cls.__module__ == "lpq_onnxrt.qmodel":
            return FRAMEWORK
        return FRAMEWORK if _looks_like_onnx_file(model) else None
    except Exception:  # detection must never raise for foreign models
        return None


@lpq.hookimpl
def lpq_query_fw_capability(
    framework: str, model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> lpq.FrameworkCapability | None:
    if framework != FRAMEWORK:
        return None
    from .capability import build_capability
    from .model_io import prepare

    return build_capability(prepare(model).model, options)


@lpq.hookimpl
def lpq_query_fused_patterns(framework: str, model: Any) -> list[tuple[str, ...]] | None:
    if framework != FRAMEWORK:
        return None
    from .capability import fused_patterns
    from .model_io import prepare

    return fused_patterns(prepare(model).model)


@lpq.hookimpl
def lpq_quantize(
    framework: str,
    model: Any,
    tune_cfg: lpq.TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None,
) -> Any | None:
    if framework != FRAMEWORK:
        return None
    if train_func is not None:
        raise lpq.ConfigError(
            "the onnxrt adaptor does only post-training quantization",
            hint="quantization-aware training needs a training framework (lpq-torch)",
        )
    from .quantize import quantize

    return quantize(model, tune_cfg, calib_dataloader)


@lpq.hookimpl
def lpq_evaluate(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[lpq.Metric],
    measurer: lpq.LatencyMeasurer | None,
    iteration: int | None,
) -> lpq.EvalResult | None:
    if framework != FRAMEWORK:
        return None
    from .evaluate import evaluate

    return evaluate(model, dataloader, postprocess, metrics, measurer, iteration)


@lpq.hookimpl
def lpq_convert_bf16(
    framework: str, model: Any, op_names: Sequence[str], dtype: Literal["bf16", "fp16"]
) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .convert import convert

    return convert(model, op_names, dtype)


@lpq.hookimpl
def lpq_inspect_tensor(
    framework: str,
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: Literal["activation", "weight", "both"],
    iteration: int | None,
) -> lpq.Inspection | None:
    if framework != FRAMEWORK:
        return None
    from .inspection import inspect

    return inspect(model, dataloader, op_names, kind, iteration)


@lpq.hookimpl
def lpq_quantized_ops(framework: str, model: Any) -> dict[str, str] | None:
    if framework != FRAMEWORK:
        return None
    from .precision import quantized_ops

    return quantized_ops(model)


@lpq.hookimpl
def lpq_resolved_config(framework: str, model: Any) -> lpq.TuneConfig | None:
    """The tune_cfg with ``auto`` range algorithms spelled out: quantized again, it gives
    the same model. None after latency-aware decisions (quantizing again would measure
    anew) and when nothing was resolved."""
    if framework != FRAMEWORK:
        return None
    from .qmodel import QuantizedModel

    if not isinstance(model, QuantizedModel) or model.range_choice is None:
        return None
    return model.tune_cfg if model.latency is None else None


@lpq.hookimpl
def lpq_set_tensor(framework: str, model: Any, tensor_name: str, value: Any) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .edit import set_tensor

    return set_tensor(model, tensor_name, value)


@lpq.hookimpl
def lpq_quantize_input(framework: str, model: Any, options: dict[str, Any]) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .edit import quantize_input

    return quantize_input(model, options)


@lpq.hookimpl
def lpq_convert(framework: str, model: Any, target: str, options: dict[str, Any]) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .edit import convert

    return convert(model, target, options)


@lpq.hookimpl
def lpq_save_model(framework: str, model: Any, path: Path) -> Path | None:
    if framework != FRAMEWORK:
        return None
    from .persist import save

    return save(model, path)


@lpq.hookimpl
def lpq_load_model(framework: str, path: Path) -> Any | None:
    if framework != FRAMEWORK:
        return None
    from .persist import load

    return load(path)
