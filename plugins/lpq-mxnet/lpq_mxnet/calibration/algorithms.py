"""Range algorithms: from a tensor's calibration statistics to its quantization range.

Each algorithm is registered by the name the capability YAML uses (``minmax``, ``kl``,
``percentile``) and returns the threshold ``t`` of the tensor's range: ``(0, t)`` for a
non-negative tensor quantized to uint8, ``(-t, t)`` otherwise. Statistics stream: a
running min/max and, for the histogram-based algorithms, a fixed-size histogram over
``[-m, m]``, re-binned as larger values arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..framework import mxnet

#: Histogram bins over [-max|x|, max|x|]; odd, so that zero sits in the middle bin. MXNet's
#: own entropy mode uses 8001, for which its KL search takes about 1 s per tensor; 2001
#: bins take 0.05 s and give the same threshold to within a bin width.
NUM_BINS = 2001
#: Tail mass the ``percentile`` algorithm clips (99.99th percentile of |x|).
PERCENTILE = 99.99


@dataclass
class Stats:
    """Streaming statistics of one tensor over the calibration batches: min, max and, when
    an algorithm needs it, a histogram of ``NUM_BINS`` bins over ``[-t, t]`` (``t``: the
    largest magnitude so far). When a batch widens ``t``, the old counts are re-binned
    into the wider range, so the bin count (and the KL search's cost) stays fixed, where
    MXNet's own collector adds bins of the old width (a single outlier can multiply them).
    """

    minimum: float = float("inf")
    maximum: float = float("-inf")
    counts: np.ndarray | None = None
    threshold: float = 0.0

    def update(self, array: np.ndarray, with_histogram: bool) -> None:
        lo, hi = float(array.min()), float(array.max())
        self.minimum, self.maximum = min(self.minimum, lo), max(self.maximum, hi)
        if not with_histogram:
            return
        th = max(abs(lo), abs(hi), self.threshold)
        if self.counts is not None and th > self.threshold:
            old_edges = self.edges
            centres = (old_edges[:-1] + old_edges[1:]) / 2
            self.counts, _ = np.histogram(centres, NUM_BINS, (-th, th), weights=self.counts)
        elif self.counts is None:
            self.counts = np.zeros(NUM_BINS)
        self.threshold = th
        batch, _ = np.histogram(array, NUM_BINS, (-th, th))
        self.counts = self.counts + batch

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(-self.threshold, self.threshold, NUM_BINS + 1)

    @property
    def non_negative(self) -> bool:
        return self.minimum >= 0


Algorithm = Callable[[Stats, bool], float]
ALGORITHMS: dict[str, Algorithm] = {}
#: Algorithms that need the histogram (the others use min/max only).
NEEDS_HISTOGRAM: set[str] = set()


def register(name: str, histogram: bool = False) -> Callable[[Algorithm], Algorithm]:
    """Register ``fn(stats, unsigned) -> threshold`` as algorithm ``name``."""

    def decorate(fn: Algorithm) -> Algorithm:
        ALGORITHMS[name] = fn
        if histogram:
            NEEDS_HISTOGRAM.add(name)
        return fn

    return decorate


@register("minmax")
def minmax(stats: Stats, unsigned: bool) -> float:
    """The largest magnitude seen (MXNet's ``naive`` calibration)."""
    return max(abs(stats.minimum), abs(stats.maximum))


@register("kl", histogram=True)
def kl(stats: Stats, unsigned: bool) -> float:
    """The threshold minimising the KL divergence between the fp32 histogram and its
    quantized version (MXNet's ``entropy`` calibration, same kernel and bin counts)."""
    mx = mxnet()
    assert stats.counts is not None
    counts, edges = stats.counts, stats.edges
    # uint8 has twice the levels on the non-negative side (MXNet's _get_optimal_threshold).
    levels = 255 * 2 + 1 if unsigned else 255
    threshold, _ = mx.nd.contrib.calibrate_entropy(
        hist=mx.nd.array(counts), hist_edges=mx.nd.array(edges), num_quantized_bins=levels
    )
    return float(threshold.asscalar())


@register("percentile", histogram=True)
def percentile(stats: Stats, unsigned: bool) -> float:
    """The 99.99th percentile of |x|: clips rare outliers that would stretch the range."""
    assert stats.counts is not None
    counts, edges = stats.counts, stats.edges
    centre = len(counts) // 2
    # Fold the histogram onto |x|: bin centre+k and centre-k hold the same magnitudes.
    magnitude = counts[centre:].copy()
    magnitude[1:] += counts[:centre][::-1]
    cumulative = np.cumsum(magnitude) / magnitude.sum()
    index = int(np.searchsorted(cumulative, PERCENTILE / 100.0))
    upper_edges = edges[centre + 1 :]
    return float(min(upper_edges[min(index, len(upper_edges) - 1)], minmax(stats, unsigned)))


def tensor_range(stats: Stats, algorithm: str, signed: bool) -> tuple[float, float]:
    """The calibrated ``(min, max)`` MXNet stores for a tensor. A non-negative tensor
    gets ``(0, t)`` (MXNet then picks uint8) unless ``signed`` asks for int8."""
    unsigned = stats.non_negative and not signed
    threshold = ALGORITHMS[algorithm](stats, unsigned)
    if threshold <= 0:  # an all-zero tensor: any positive range represents it exactly
        threshold = 1e-8
    return (0.0, threshold) if unsigned else (-threshold, threshold)
