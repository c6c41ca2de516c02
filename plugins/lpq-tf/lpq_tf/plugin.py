"""The lpq entry point of the TensorFlow / Keras / LiteRT adaptor (``tf``): registration only.

``plugin`` (a :class:`TfPlugin`) is what the entry point ``tf = "lpq_tf.plugin:plugin"``
names. Its registration hooks describe the adaptor; its job methods are bound to lpq's
per-framework hooks by :class:`lpq.AdaptorHooks` (which declines other frameworks) and
import the module that does the job only when called. Importing this module therefore
never imports tensorflow, keras or ai-edge-litert, so ``lpq plugins list`` stays fast.
Nothing in the package imports this module: it sits on top of the import graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import lpq

from .info import (
    FRAMEWORK,
    KERAS_SUFFIX,
    TFLITE_SUFFIX,
    capability_files,
    detect,
    installed_distribution,
)


class TfPlugin(lpq.AdaptorHooks):
    """Registration hooks and the jobs of the tf adaptor."""

    framework = FRAMEWORK

    @lpq.hookimpl
    def lpq_register_adaptors(self, register: Callable[[lpq.AdaptorInfo], None]) -> None:
        register(
            lpq.AdaptorInfo(
                framework=FRAMEWORK,
                framework_distribution=installed_distribution(),
                capability_files=capability_files(),
                description="TensorFlow / Keras / LiteRT: full-integer int8, 16x8 and dynamic "
                "TFLite models run with ai-edge-litert, per-op float fallback",
                model_suffixes=(KERAS_SUFFIX, TFLITE_SUFFIX),
                install_hint="pip install lpq-tf",
            )
        )

    @lpq.hookimpl
    def lpq_register_backend_profiles(self, register: Callable[[lpq.BackendProfile], None]) -> None:
        register(
            lpq.BackendProfile(
                name="tflite-cpu",
                framework=FRAMEWORK,
                description="LiteRT on CPU (XNNPACK), float model inputs and outputs",
                options={"io_dtype": "float32"},
            )
        )
        register(
            lpq.BackendProfile(
                name="tflite-int8-io",
                framework=FRAMEWORK,
                description="integer-only model: int8 inputs and outputs too (microcontrollers, "
                "NPUs); lpq quantizes float data fed to it when evaluating",
                # integer-only targets: this CPU's timings say nothing about them
                options={"io_dtype": "int8", "latency_aware": False},
            )
        )

    # Jobs: each is the matching lpq_* hook minus ``framework`` (see lpq.AdaptorHooks).

    def detect(self, model: Any) -> bool:
        return detect(model)

    def query_capability(
        self, model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
    ) -> lpq.FrameworkCapability:
        from .capability import query_capability

        return query_capability(model, dataloader, options)

    def quantize(
        self,
        model: Any,
        tune_cfg: lpq.TuneConfig,
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
        metrics: Sequence[lpq.Metric],
        measurer: lpq.LatencyMeasurer | None,
        iteration: int | None,
    ) -> lpq.EvalResult:
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
    ) -> lpq.Inspection:
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


plugin = TfPlugin()
