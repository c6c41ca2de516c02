"""The lpq entry point of the TensorFlow / Keras / LiteRT adaptor (``tf``): registration only.

``plugin`` (a :class:`TfPlugin`) is what the entry point ``tf = "lpq_tf.plugin:plugin"``
names. Its registration hooks describe the adaptor; its job methods are bound to lpq's
per-framework hooks by :class:`lpq.AdaptorHooks` (which declines other frameworks) and
import the module that does the job only when called. Importing this module therefore
never imports tensorflow, keras or ai-edge-litert, so ``lpq plugins list`` stays fast.
Nothing in the package imports this module: it sits on top of the import graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lpq
from lpq import lazy_job

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

    query_capability = lazy_job("lpq_tf.capability:query_capability")
    quantize = lazy_job("lpq_tf.quantize:quantize")
    evaluate = lazy_job("lpq_tf.evaluate:evaluate")
    output_names = lazy_job("lpq_tf.evaluate:output_names")
    cast_lowp = lazy_job("lpq_tf.lowp:cast_lowp")
    inspect_tensor = lazy_job("lpq_tf.inspection:inspect_tensor")
    quantized_ops = lazy_job("lpq_tf.precision:quantized_ops")
    resolved_config = lazy_job("lpq_tf.qmodel:resolved_config")
    save = lazy_job("lpq_tf.persist:save")
    load = lazy_job("lpq_tf.persist:load")


plugin = TfPlugin()
