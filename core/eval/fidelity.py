"""The fidelity gate of ``lpq quantize``: how much of what the fp32 model does the
quantized model still does, measured on samples it was not calibrated on.

Why a task metric and held-out samples: the cosine of a raw output tensor can read 0.999
while a detector keeps a third of its detections, and a model scored on its own
calibration samples looks better than it is. So the gate scores the quantized model
against the fp32 model's outputs with the task's metric (detection F1, CTC string
agreement, top-1 agreement, ... chosen from the outputs by
:func:`lpq.eval.metric_choice.label_free_metric`, or named by the user) on held-out samples:
the user's evaluation data, or the last fifth of the calibration data, which is then not
used to calibrate. It also times both models side by side, so the report shows fidelity
beside speed and size.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, DataError
from .data import ArrayLoader, OutputRecorder, ReferenceLoader, batch_size, head, split_batch
from .evaluation import LatencyMeasurer
from .metric_choice import fidelity_metric
from .runtimes import runtimes_kept

#: Share of the calibration samples held out when no evaluation data is given.
HELD_OUT_SHARE = 0.2
#: Below this, ``lpq quantize`` says plainly that the model lost much of what fp32 does.
DEFAULT_WARN_BELOW = 0.95
#: Rounds of the side-by-side timing, and batches per round and model (the first one a
#: warm-up). Each round makes a session per model (loading the fp32 file again): 3 rounds
#: of 6 time as many batches as 5 rounds of 4 did with 6 sessions instead of 10 (ddddocr
#: rec, 54 MB: each fp32 session is a 54 MB load, a 54 MB copy for ORT and its init).
_TIMING_ROUNDS = 3
_TIMING_BATCHES = 6


@dataclass
class Fidelity:
    """The gate's reading: ``value`` of ``metric`` (higher is better) on ``samples``
    held-out samples, and both models' latency per batch, timed alternately."""

    metric: str
    value: float
    reason: str
    samples: int
    held_out_from: str
    fp32_ms: float | None = None
    quantized_ms: float | None = None
    #: samples per timed batch (``fp32_ms`` and ``quantized_ms`` are per such batch)
    timed_batch: int | None = None

    @property
    def speedup(self) -> float | None:
        if not self.fp32_ms or not self.quantized_ms:
            return None
        return self.fp32_ms / self.quantized_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "reason": self.reason,
            "samples": self.samples,
            "held_out_from": self.held_out_from,
            "fp32_ms": self.fp32_ms,
            "quantized_ms": self.quantized_ms,
            "timed_batch": self.timed_batch,
            "speedup": self.speedup,
        }


def _slice(loader: ArrayLoader, start: int, stop: int) -> ArrayLoader:
    inputs: Any = loader.inputs
    part: Any = (
        {name: array[start:stop] for name, array in inputs.items()}
        if isinstance(inputs, Mapping)
        else inputs[start:stop]
    )
    labels = loader.labels[start:stop] if loader.labels is not None else None
    sliced = ArrayLoader(part, labels, loader.batch_size)
    sliced.source, sliced.names = loader.source, loader.names
    return sliced


def split_held_out(
    calib: ArrayLoader, share: float = HELD_OUT_SHARE
) -> tuple[ArrayLoader, ArrayLoader]:
    """``(calibration, held_out)``: the last ``share`` of the samples (at least one) are
    held out; the rest calibrate. Needs at least two samples."""
    n = calib.num_samples
    if n < 2:
        raise ConfigError(
            "the calibration data has one sample: none can be held out to measure fidelity",
            hint="pass --eval with held-out samples, or more calibration samples",
        )
    held = min(n - 1, max(1, math.ceil(n * share)))
    return _slice(calib, 0, n - held), _slice(calib, n - held, n)


def measure_fidelity(
    pm: Any,
    framework: str,
    fp32_model: Any,
    quantized_model: Any,
    held_out: ArrayLoader,
    *,
    held_out_from: str,
    metric: str | None = None,
    metric_options: Mapping[str, Any] | None = None,
    task: str | None = None,
    time_models: bool = True,
    timing_batch: int | None = 1,
) -> Fidelity:
    """Score ``quantized_model`` against ``fp32_model``'s outputs on ``held_out``.

    ``metric`` names a registered metric (made with ``metric_options``, e.g. a detection
    metric's ``score_threshold``); without it the metric is chosen from the fp32
    outputs (``task``, e.g. ``"ctc"``, settles shapes that could be several tasks).
    Both models are timed on the first ``timing_batch`` samples of the first held-out
    batch (None: that whole batch), the batch latency-aware decisions are made at
    (``latency_batch_size``, one sample by default).
    """

    recorder = OutputRecorder()
    pm.evaluate(framework, fp32_model, held_out, [recorder])
    if not recorder.outputs:
        raise ConfigError("the held-out data gave no batch", hint="pass at least one sample")
    names = pm.output_names(framework, fp32_model) if metric is None else None
    metric, reason = fidelity_metric(
        recorder.outputs[0], metric, metric_options, task=task, names=names
    )
    scorer = pm.create_metric(metric, **dict(metric_options or {}))
    result = pm.evaluate(
        framework, quantized_model, ReferenceLoader(held_out, recorder.outputs), [scorer]
    )
    value = float(result.metrics[scorer.name])
    fidelity = Fidelity(metric, value, reason, held_out.num_samples, held_out_from)
    if time_models:
        fidelity.timed_batch, (fidelity.fp32_ms, fidelity.quantized_ms) = _timed(
            pm, framework, fp32_model, quantized_model, held_out, timing_batch
        )
    return fidelity


def _timed(
    pm: Any,
    framework: str,
    fp32_model: Any,
    quantized_model: Any,
    data: ArrayLoader,
    batch: int | None,
) -> tuple[int, tuple[float | None, float | None]]:
    """``(samples per timed batch, (fp32 ms, quantized ms))``: the first ``batch`` samples
    of the first batch, or that whole batch when the model will not take fewer.

    Not the held-out batch as it comes: it holds a fifth of the calibration samples (13 of
    64 by default), a batch nobody serves, and timing it cost PP-OCRv4 det 11 of its 54 CPU
    s of quantization, while the decisions it reports on were made on one sample."""
    first = next(iter(data))
    inputs, labels = split_batch(first)
    whole = batch_size(inputs)
    if batch is not None and 0 < batch < whole:
        part = head(inputs, batch)
        item = part if inputs is first else (part, None if labels is None else labels[:batch])
        try:
            return batch, _interleaved_ms(pm, framework, fp32_model, quantized_model, item)
        except DataError:  # a fixed batch: timed as it comes
            pass
    return whole, _interleaved_ms(pm, framework, fp32_model, quantized_model, first)


def _interleaved_ms(
    pm: Any, framework: str, fp32_model: Any, quantized_model: Any, first: Any
) -> tuple[float | None, float | None]:
    """Median ms per batch of each model on the batch ``first``, timed alternately over a
    few rounds (a busy machine slows both alike, so their ratio holds)."""
    times: dict[int, list[float]] = {0: [], 1: []}
    # Each round runs both models again: an adaptor may keep their runtimes for the rounds
    # (lpq.kept_runtime; lpq-onnxrt's sessions of MiniLM cost 0.1 CPU s each to make)
    with runtimes_kept():
        for _ in range(_TIMING_ROUNDS):
            for index, model in enumerate((fp32_model, quantized_model)):
                measurer = LatencyMeasurer(warmup=1)
                pm.evaluate(framework, model, [first] * _TIMING_BATCHES, [], measurer=measurer)
                if measurer.median_ms is not None:
                    times[index].append(measurer.median_ms)
    return tuple(  # type: ignore[return-value]
        statistics.median(values) if values else None for values in (times[0], times[1])
    )
