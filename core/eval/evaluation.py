"""Types that cross the evaluate / inspect hooks: measurer, results, metric protocol."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Metric(Protocol):
    """An accumulating metric over batches of numpy predictions and labels.

    An adaptor's ``lpq_evaluate`` converts each batch's outputs to numpy (a single array,
    or a list of arrays for multi-output models) and calls ``update``; ``result`` returns
    one float. ``higher_is_better`` tells the tuner which way accuracy improves.
    """

    name: str
    higher_is_better: bool

    def reset(self) -> None: ...

    def update(self, preds: Any, labels: Any) -> None: ...

    def result(self) -> float: ...


#: Optional user hook applied to each batch before the metrics: ``(preds, labels) -> same``.
Postprocess = Callable[[Any, Any], tuple[Any, Any]]


class LatencyMeasurer:
    """Times the model-execution part of each batch, excluding data loading and metrics.

    An adaptor wraps only its framework's run call: ``with measurer.measure(): run()``.
    ``warmup`` batches are timed but ignored, because first runs include lazy allocation
    and compilation.
    """

    def __init__(self, warmup: int = 1) -> None:
        self.warmup = warmup
        self.samples: list[float] = []
        self._seen = 0

    @contextmanager
    def measure(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self._seen += 1
            if self._seen > self.warmup:
                self.samples.append(elapsed)

    def reset(self) -> None:
        self.samples.clear()
        self._seen = 0

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.samples) * 1e3 if self.samples else None

    def quantile_ms(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) of the timed batches, in ms (0.2: what the model
        takes when other jobs on the machine leave it alone)."""
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


@dataclass
class EvalResult:
    """What ``lpq_evaluate`` returns: each metric's value and the measured latency."""

    metrics: dict[str, float]
    latency_ms: float | None = None
    batches: int = 0
    samples: int = 0

    @property
    def accuracy(self) -> float:
        """The first metric's value: the one the tuner optimises."""
        if not self.metrics:
            raise ValueError("evaluation produced no metric values")
        return next(iter(self.metrics.values()))


@dataclass
class Inspection:
    """Tensors captured by ``lpq_inspect_tensor``, keyed by the *fp32 model's* op names.

    ``activations[op_name]`` holds that op's first output, one array per inspected batch,
    dequantized to float for quantized models so fp32 and quantized runs compare directly.
    ``weights[op_name]`` maps each weight tensor name of the op to its (dequantized) value.
    """

    activations: dict[str, list[np.ndarray]] = field(default_factory=dict)
    weights: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def evaluate_batches(
    batches: Iterable[tuple[Any, Any]],
    run: Callable[[Any], Any],
    metrics: Sequence[Metric],
    *,
    postprocess: Postprocess | None = None,
    measurer: LatencyMeasurer | None = None,
    iteration: int | None = None,
    to_numpy: Callable[[Any], Any] | None = None,
    count: Callable[[Any], int] | None = None,
) -> EvalResult:
    """The evaluation loop every adaptor's ``lpq_evaluate`` shares.

    ``batches`` yields ``(inputs, labels)`` with inputs already in the framework's form;
    ``run(inputs)`` is the framework call, the only part the measurer times;
    ``to_numpy`` turns its outputs into what metrics take (numpy, or a list of arrays);
    ``count(inputs)`` is the number of samples in a batch (default: leading dimension).
    Raises :class:`lpq.DataError` if there is no batch to evaluate.
    """
    from .data import batch_size

    for metric in metrics:
        metric.reset()
    done = samples = 0
    for inputs, labels in batches:
        if iteration is not None and done >= iteration:
            break
        if measurer is not None:
            with measurer.measure():
                outputs = run(inputs)
        else:
            outputs = run(inputs)
        preds = to_numpy(outputs) if to_numpy is not None else outputs
        if postprocess is not None:
            preds, labels = postprocess(preds, labels)
        for metric in metrics:
            metric.update(preds, labels)
        done += 1
        samples += count(inputs) if count is not None else batch_size(inputs)
    if done == 0:
        from ..errors import DataError

        raise DataError("the evaluation dataloader yielded no batches", hint="pass non-empty data")
    return EvalResult(
        metrics={metric.name: float(metric.result()) for metric in metrics},
        latency_ms=measurer.median_ms if measurer is not None else None,
        batches=done,
        samples=samples,
    )
