"""Running a model over a dataloader: metrics, latency and iteration limits.

Quantized models run as ``.tflite`` in ai-edge-litert's interpreter. The fp32 baseline of
a Keras model has two honest forms, its float ``.tflite`` in the same interpreter and the
Keras model compiled with ``tf.function``; when latency is measured, lpq times both on the
first batch and keeps the faster for the whole run (:func:`fp32_runtime`), so a reported
speedup is never against a needlessly slow baseline. Without a measurer (accuracy only)
the float ``.tflite`` runs; both agree to about 1e-5.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from lpq import EvalResult, LatencyMeasurer, Metric, evaluate_batches, kept_runtime

from .model_io import Prepared, prepare
from .qmodel import QuantizedModel
from .runtime import Runner
from .tfenv import import_tf

log = logging.getLogger(__name__)
_PROBE_RUNS = 3


def output_names(model: Any) -> list[str]:
    """The model's output names, in the order :func:`evaluate` passes the outputs on: the
    serving signature's names (Keras output layer names, MediaPipe's ``regressors`` /
    ``classificators``), else the output tensors' own."""
    from ai_edge_litert import schema_py_generated as schema

    from .graph import read

    content = model.content if isinstance(model, QuantizedModel) else prepare(model).float_tflite
    parsed = read(content)
    named: dict[int, str] = {}
    root = schema.Model.GetRootAs(content, 0)
    for i in range(root.SignatureDefsLength()):
        signature = root.SignatureDefs(i)
        if signature.SubgraphIndex() != 0:
            continue
        for j in range(signature.OutputsLength()):
            entry = signature.Outputs(j)
            named.setdefault(entry.TensorIndex(), (entry.Name() or b"").decode())
    return [named.get(index) or parsed.tensors[index].name for index in parsed.outputs]


def threads(options: dict[str, Any]) -> int | None:
    """``num_threads`` from the options, else ``LPQ_TF_THREADS``, else LiteRT's default."""
    value = options.get("num_threads", os.environ.get("LPQ_TF_THREADS"))
    return int(value) if value not in (None, "") else None


def _keras_call(prepared: Prepared) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The Keras model as one ``tf.function`` per prepared model (traced once per shape)."""
    if "keras_call" not in prepared.cache:
        tf = import_tf()
        model: Any = prepared.keras_model  # set: only Keras models get here
        graph = tf.function(lambda *xs: model(xs[0] if len(xs) == 1 else list(xs), training=False))
        prepared.cache["keras_call"] = lambda arrays: [np.asarray(graph(*arrays))]
    call: Callable[[list[np.ndarray]], list[np.ndarray]] = prepared.cache["keras_call"]
    return call


def _best_ms(call: Callable[[list[np.ndarray]], Any], arrays: list[np.ndarray]) -> float:
    call(arrays)  # warm-up: tracing, XNNPACK weight packing
    times = []
    for _ in range(_PROBE_RUNS):
        start = time.perf_counter()
        call(arrays)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def fp32_runtime(prepared: Prepared, runner: Runner, arrays: list[np.ndarray]) -> str:
    """``keras`` or ``litert``: the faster fp32 form of a Keras model, decided once."""
    if "fp32_runtime" not in prepared.cache:
        choice, timings = "litert", {}
        if prepared.keras_model is not None and len(runner.outputs) == 1:
            timings = {
                "keras": _best_ms(_keras_call(prepared), arrays),
                "litert": _best_ms(runner.run, arrays),
            }
            choice = min(timings, key=timings.__getitem__)
            log.info("fp32 baseline of %s: %s (%s)", prepared.source, choice, timings)
        prepared.cache["fp32_runtime"] = choice
        prepared.cache["fp32_runtime_ms"] = timings
    result: str = prepared.cache["fp32_runtime"]
    return result


def evaluate(
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult:
    """The ``lpq_evaluate`` answer: a quantized model runs as its ``.tflite`` in LiteRT,
    an fp32 model as its float ``.tflite`` or, when latency is measured, as the faster of
    that and the Keras model (:func:`fp32_runtime`)."""
    prepared: Prepared | None = None
    if isinstance(model, QuantizedModel):
        content, options = model.content, dict(model.options)
    else:
        prepared = prepare(model)
        content, options = prepared.float_tflite, {}
    # One interpreter per model and thread count inside lpq.runtimes_kept (the fidelity
    # gate's timing rounds); a new one per call elsewhere.
    count = threads(options)
    runner = kept_runtime(("tf", id(content), count), lambda: Runner(content, count), holds=content)
    call: Callable[[list[np.ndarray]], list[np.ndarray]] = runner.run
    batches = runner.batches(dataloader)
    if prepared is not None and measurer is not None:
        first = next(batches)
        if fp32_runtime(prepared, runner, first[0]) == "keras":
            call = _keras_call(prepared)
        batches = _chain(first, batches)

    def run(arrays: list[np.ndarray]) -> Any:
        outputs = call(arrays)
        return outputs[0] if len(outputs) == 1 else outputs

    return evaluate_batches(
        batches,
        run,
        metrics,
        postprocess=postprocess,
        measurer=measurer,
        iteration=iteration,
        count=lambda arrays: len(arrays[0]) if arrays[0].ndim else 1,
    )


def _chain(first: Any, rest: Iterable[Any]) -> Any:
    yield first
    yield from rest
