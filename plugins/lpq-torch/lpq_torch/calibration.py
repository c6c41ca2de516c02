"""Calibration: the activation observers lpq-torch offers, and running calibration data.

Observers are chosen by the tune_cfg's activation ``algorithm`` from :data:`OBSERVERS`
(adding one is one class or import plus one YAML line):

* ``minmax`` - :class:`MinMaxObserver`: the observed range; cheap, outliers stretch it.
* ``mse`` - torchao's :class:`HistogramObserver` (the default of its x86 recipe): keeps a
  histogram and searches the range that minimises the L2 (squared) quantization error.
* ``percentile`` - :class:`PercentileObserver`: clips the range at a percentile of the
  same streaming histogram.

Histograms stream: memory stays bounded however many samples are calibrated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torchao.quantization.pt2e import HistogramObserver, MinMaxObserver

from lpq import ConfigError, split_batch, take_samples

from .data import call_args, describe
from .errors import stage


class PercentileObserver(HistogramObserver):
    """Clips the range to the ``percentile``-th percentile of the observed histogram.

    Outliers then no longer stretch the scale; the histogram is the one HistogramObserver
    keeps while calibrating, so memory stays bounded (streaming, not storing activations).
    """

    def __init__(self, percentile: float = 99.99, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.percentile = percentile

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.min_val.numel() == 0 or float(self.min_val) == float("inf"):
            return super().calculate_qparams()
        hist = self.histogram.double()
        total = float(hist.sum())
        if total <= 0:
            return super().calculate_qparams()
        cdf = torch.cumsum(hist, 0) / total
        tail = (100.0 - self.percentile) / 100.0
        edges = torch.linspace(float(self.min_val), float(self.max_val), self.bins + 1)
        lo_bin = int(torch.searchsorted(cdf, torch.tensor(tail, dtype=cdf.dtype)))
        hi_bin = int(torch.searchsorted(cdf, torch.tensor(1.0 - tail, dtype=cdf.dtype)))
        new_min = edges[min(lo_bin, self.bins)].reshape(())
        new_max = edges[min(hi_bin + 1, self.bins)].reshape(())
        # Keep zero exactly representable and never clip a one-signed tensor past zero.
        new_min = torch.minimum(new_min, self.min_val.clamp(min=0))
        return self._calculate_qparams(new_min.to(self.min_val), new_max.to(self.max_val))


#: Activation algorithm (capability YAML / tune_cfg) -> observer class.
OBSERVERS: dict[str, type[Any]] = {
    "minmax": MinMaxObserver,
    "mse": HistogramObserver,
    "percentile": PercentileObserver,
}


def activation_observer(algorithm: str) -> type[Any]:
    try:
        return OBSERVERS[algorithm]
    except KeyError:
        raise ConfigError(
            f"activation algorithm {algorithm!r} is not supported by lpq-torch",
            hint=f"use one of {', '.join(OBSERVERS)}",
        ) from None


def calibrate(
    prepared: torch.fx.GraphModule, dataloader: Iterable[Any] | None, samples: int
) -> list[tuple[float, float]]:
    """Run up to ``samples`` samples through the observers (QAT: initialises scales).

    Returns the observed (min, max) of each float output of the model, in pytree order:
    what :func:`lpq_torch.edit.quantize_input` needs to hand out integer outputs.
    """
    ranges: list[tuple[float, float]] = []
    if dataloader is None:
        return ranges
    with torch.no_grad():
        for item in take_samples(dataloader, max(1, samples)):
            args = call_args(split_batch(item)[0])
            with stage("calibrate", f"a batch {describe(args)}"):
                outputs = prepared(*args[0], **args[1])
            ranges = _widened(ranges, outputs)
    return ranges


def _widened(ranges: list[tuple[float, float]], outputs: Any) -> list[tuple[float, float]]:
    leaves = [
        t
        for t in pytree.tree_leaves(outputs)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    found = [(float(t.min()), float(t.max())) for t in leaves if t.numel()]
    if not ranges or len(ranges) != len(found):
        return found
    return [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(ranges, found)]
