"""Running a model over a dataloader in LiteRT: metrics, latency and iteration limits.

Every model runs as a ``.tflite`` in ai-edge-litert's interpreter with the same thread
count, quantized or not: the fp32 baseline of a Keras model or SavedModel is its float
``.tflite`` conversion (XNNPACK), which bench/bench_tf.py measures against Keras itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from lpq import EvalResult, LatencyMeasurer, Metric, evaluate_batches

from .runtime import Runner


def runnable(model: Any) -> tuple[bytes, dict[str, Any]]:
    """The ``.tflite`` bytes to run for ``model`` and its runtime options."""
    from .model_io import prepare
    from .qmodel import QuantizedModel

    if isinstance(model, QuantizedModel):
        return model.content, dict(model.options)
    return prepare(model).float_tflite, {}


def threads(options: dict[str, Any]) -> int | None:
    """``num_threads`` from the options, else ``LPQ_TF_THREADS``, else LiteRT's default."""
    value = options.get("num_threads", os.environ.get("LPQ_TF_THREADS"))
    return int(value) if value not in (None, "") else None


def evaluate(
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult:
    content, options = runnable(model)
    runner = Runner(content, threads(options))

    def run(arrays: list[Any]) -> Any:
        outputs = runner.run(arrays)
        return outputs[0] if len(outputs) == 1 else outputs

    return evaluate_batches(
        runner.batches(dataloader),
        run,
        metrics,
        postprocess=postprocess,
        measurer=measurer,
        iteration=iteration,
        count=lambda arrays: len(arrays[0]) if arrays[0].ndim else 1,
    )
