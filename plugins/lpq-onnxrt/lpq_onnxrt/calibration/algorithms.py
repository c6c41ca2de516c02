"""Range algorithms (numpy only), chosen by name from a registry.

Each takes a tensor's streaming histogram (:class:`.histogram._TensorHistogram`), whether
the range is symmetric, the number of quantization levels and a percentile, and returns
``(lo, hi)``. Adding an algorithm is one decorated function here plus its name in the
capability YAML's ``algorithm`` lists (and the block's ``algorithms``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .histogram import _TensorHistogram as Histogram
else:
    Histogram = Any

Range = tuple[float, float]
RangeFunction = Callable[[Any, bool, int, float], Range]

#: name -> range function; the registry :meth:`CalibrationStats.compute_range` reads.
ALGORITHMS: dict[str, RangeFunction] = {}

# Candidate thresholds evaluated in the coarse pass of the KL search; the best one is
# then refined bin by bin. Keeps kl at O(num_bins * _KL_COARSE_STEPS) per tensor.
_KL_COARSE_STEPS = 256


def register(name: str) -> Callable[[RangeFunction], RangeFunction]:
    def add(function: RangeFunction) -> RangeFunction:
        ALGORITHMS[name] = function
        return function

    return add


@register("minmax")
def _minmax(h: Histogram, symmetric: bool, levels: int, percentile: float) -> Range:
    if symmetric:
        t = max(-h.minimum, h.maximum)
        return -t, t
    return h.minimum, h.maximum


def _histogram_quantile(
    counts: np.ndarray, start: float, width: float, q: float, low: float, high: float
) -> float:
    """Value at quantile ``q`` of histogram ``counts`` whose first bin starts at ``start``.

    Follows ``np.percentile``: interpolate linearly between the order statistics at
    ``floor(q * (N - 1))`` and the next one. Each order statistic is placed inside its
    bin as if the bin's values were evenly spread, so it is off by less than one bin;
    the first and last are the exact extremes ``low`` and ``high``.
    """
    total = int(counts.sum())
    cumulative = np.cumsum(counts)

    def order_statistic(rank: int) -> float:
        if rank <= 0:
            return low
        if rank >= total - 1:
            return high
        k = int(np.searchsorted(cumulative, rank, side="right"))
        before = int(cumulative[k - 1]) if k > 0 else 0
        value = start + (k + (rank - before + 0.5) / int(counts[k])) * width
        return min(max(value, low), high)

    position = q * (total - 1)
    below = math.floor(position)
    fraction = position - below
    value = order_statistic(below)
    if fraction > 0.0:
        value += fraction * (order_statistic(below + 1) - value)
    return value


@register("percentile")
def _percentile_range(h: Histogram, symmetric: bool, levels: int, percentile: float) -> Range:
    q = percentile / 100.0
    if h.bound == 0.0:
        return 0.0, 0.0
    width = h.bin_width
    if symmetric:
        largest = max(-h.minimum, h.maximum)
        smallest = max(h.minimum, -h.maximum, 0.0)  # lower bound of min |x|
        t = _histogram_quantile(h.magnitudes(), 0.0, width, q, smallest, largest)
        return -t, t
    signed = np.concatenate([h.negative[::-1], h.positive])
    lo = _histogram_quantile(signed, -h.bound, width, 1.0 - q, h.minimum, h.maximum)
    hi = _histogram_quantile(signed, -h.bound, width, q, h.minimum, h.maximum)
    return lo, hi


@register("kl")
def _kl_range(h: Histogram, symmetric: bool, levels: int, percentile: float) -> Range:
    return clipped_range(h, symmetric, levels, _kl_threshold)


def clipped_range(
    h: Histogram,
    symmetric: bool,
    levels: int,
    threshold: Callable[[np.ndarray, float, int], float],
) -> Range:
    """The range from a clipping ``threshold(counts, bin_width, levels)`` on |x|: half the
    levels per side for symmetric or mixed-sign data, all levels for one-signed data (e.g.
    after ReLU); never wider than the data."""
    if h.bound == 0.0:
        return 0.0, 0.0
    one_sided = h.minimum >= 0.0 or h.maximum <= 0.0
    if symmetric or not one_sided:
        t = min(threshold(h.magnitudes(), h.bin_width, levels // 2), max(-h.minimum, h.maximum))
        if symmetric:
            return -t, t
        return max(h.minimum, -t), min(h.maximum, t)
    if h.minimum >= 0.0:
        return 0.0, min(threshold(h.positive, h.bin_width, levels), h.maximum)
    return -min(threshold(h.negative, h.bin_width, levels), -h.minimum), 0.0


def _kl_threshold(counts: np.ndarray, width: float, levels: int) -> float:
    """Clipping threshold on |x| whose ``levels``-level quantization loses least (KL).

    For each candidate threshold of ``i`` bins the reference distribution P is the first
    ``i`` bins with everything beyond folded into the last one; Q spreads each of
    ``levels`` groups of bins evenly over the group's non-empty bins. The threshold with
    the smallest KL(P || Q) wins. A coarse pass over at most ``_KL_COARSE_STEPS``
    candidates is refined bin by bin around its best.
    """
    nonzero = np.flatnonzero(counts)
    used = int(nonzero[-1]) + 1
    if used <= levels:
        return used * width
    counts = counts[:used].astype(np.float64)
    suffix = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # suffix[i] = sum(counts[i:])
    # Made once for every candidate (each used to make its own prefix of these).
    positions = np.arange(used) * levels
    occupied_all = (counts > 0).astype(np.float64)
    total = suffix[0]

    def divergence(i: int) -> float:
        reference = counts[:i].copy()
        reference[-1] += suffix[i]
        group = positions[:i] // i
        occupied = occupied_all[:i]
        group_sum = np.bincount(group, weights=counts[:i], minlength=levels)
        group_occupied = np.bincount(group, weights=occupied, minlength=levels)
        spread = group_sum / np.maximum(group_occupied, 1.0)
        quantized = spread[group] * occupied
        # reference sums to the total count exactly (integer-valued floats below 2**53)
        p = reference / total
        q = quantized / max(quantized.sum(), 1e-300)
        mask = p > 0
        p_used = p[mask]
        q_safe = np.maximum(q[mask], 1e-12)  # P mass where Q has none: large, finite cost
        return float(np.sum(p_used * np.log(p_used / q_safe)))

    step = max(1, (used - levels) // _KL_COARSE_STEPS)
    coarse = [*range(levels, used, step), used]
    best = min(coarse, key=divergence)
    fine = range(max(levels, best - step + 1), min(used, best + step - 1) + 1)
    best = min(fine, key=divergence) if step > 1 else best
    return best * width


@register("mse")
def _mse_range(h: Histogram, symmetric: bool, levels: int, percentile: float) -> Range:
    """The clipping threshold with the least expected quantize-dequantize squared error."""
    return clipped_range(h, symmetric, levels, mse_threshold)


def mse_threshold(counts: np.ndarray, width: float, levels: int) -> float:
    """Threshold ``t`` on |x| minimizing ``sum(count * err(x, t))`` over the histogram.

    Values inside ``[0, t]`` are rounded to a grid of step ``t / levels``: uniform error
    with mean square ``step**2 / 12``. Values beyond ``t`` are clipped: error
    ``(|x| - t)**2``. Each bin's values are taken at its centre. Every bin edge from
    ``levels`` bins up is a candidate; all are scored at once from suffix sums.
    """
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        return 0.0
    used = int(nonzero[-1]) + 1
    c = counts[:used].astype(np.float64)
    x = (np.arange(used) + 0.5) * width
    # candidates: thresholds at bin edges 1..used (in bins)
    edges = np.arange(1, used + 1)
    t = edges * width
    inside = np.cumsum(c)  # count of bins below each edge
    tail0 = c.sum() - inside
    s1 = np.concatenate([np.cumsum((c * x)[::-1])[::-1][1:], [0.0]])
    s2 = np.concatenate([np.cumsum((c * x * x)[::-1])[::-1][1:], [0.0]])
    clipped = s2 - 2.0 * t * s1 + t * t * tail0
    rounding = inside * (t / levels) ** 2 / 12.0
    best = int(np.argmin(rounding + clipped))
    return float(t[best])
