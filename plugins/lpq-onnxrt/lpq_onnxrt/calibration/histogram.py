"""Streaming per-tensor statistics (numpy only): exact extremes plus histograms.

ONNX Runtime's own Entropy and Percentile calibrators keep every activation of every
calibration sample in memory before building a histogram (gigabytes for a ResNet-50 at
32 samples). Here each tensor keeps only its exact running min/max and a fixed-size
histogram of magnitudes, split by sign, so memory does not grow with the number of
samples: outputs of one feed are folded in and dropped before the next feed runs.

Why power-of-two histogram ranges: the histogram covers ``[0, R]`` with ``R`` a power
of two and ``num_bins`` (a power of two) bins, so the bin width is a power of two too.
When new data exceeds ``R`` the range doubles (as often as needed) and adjacent bins are
merged in pairs. Bin edges of the wider histogram are edges of the narrower one and
scaling by a power of two is exact in floating point, so the final histogram is
*identical* however the data was chunked: streaming changes nothing. The price is a
resolution between ``num_bins / 2`` and ``num_bins`` bins over ``[0, max|x|]``.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lpq import ConfigError, DataError, atomic_write

from .algorithms import ALGORITHMS

_FORMAT = "lpq-calibration-stats/1"
#: Values binned per numpy pass (see :meth:`_TensorHistogram._bin`).
_BIN_SLICE = 1 << 16


@dataclass
class _TensorHistogram:
    """Exact extremes plus sign-split magnitude histograms of one tensor."""

    num_bins: int
    minimum: float = math.inf
    maximum: float = -math.inf
    count: int = 0
    nonfinite: int = 0
    # Upper end of the histogram range; 0.0 until a non-zero value arrives.
    bound: float = 0.0
    positive: np.ndarray = field(init=False)  # counts of x >= 0 by |x| bin
    negative: np.ndarray = field(init=False)  # counts of x < 0 by |x| bin
    # compute_range results, keyed by its arguments; cleared whenever data arrives.
    ranges: dict[tuple[Any, ...], tuple[float, float]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.positive = np.zeros(self.num_bins, dtype=np.int64)
        self.negative = np.zeros(self.num_bins, dtype=np.int64)

    @property
    def bin_width(self) -> float:
        return self.bound / self.num_bins

    def magnitudes(self) -> np.ndarray:
        """Histogram of |x| over ``[0, bound]``."""
        return self.positive + self.negative

    def add(self, values: np.ndarray) -> None:
        flat = values.reshape(-1)
        if flat.size == 0:
            return
        lo, hi = float(flat.min()), float(flat.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            # a NaN makes min and max NaN, an infinity shows in one of them: only then is
            # the whole tensor checked value by value
            finite = np.isfinite(flat)
            self.nonfinite += int(flat.size - np.count_nonzero(finite))
            flat = flat[finite]
            if flat.size == 0:
                return
            lo, hi = float(flat.min()), float(flat.max())
        self.ranges.clear()
        self.minimum = min(self.minimum, lo)
        self.maximum = max(self.maximum, hi)
        self.count += int(flat.size)
        largest = max(-lo, hi)
        if largest > self.bound:
            self._widen(_power_of_two_at_least(largest))
        if self.bound == 0.0:  # only zeros so far: they live in bin 0 of any range
            self.positive[0] += flat.size
            return
        self._bin(flat)

    def _bin(self, flat: np.ndarray) -> None:
        # In slices that stay in the CPU cache: the six passes over each slice then run
        # from cache, not memory (2.4x faster on 20M floats; counts identical).
        for start in range(0, flat.size, _BIN_SLICE):
            self._bin_slice(flat[start : start + _BIN_SLICE])

    def _bin_slice(self, flat: np.ndarray) -> None:
        n = self.num_bins
        scale = n / self.bound  # a power of two: the multiplication below is exact
        if flat.dtype != np.float64 and not 2.0**-100 < scale < 2.0**100:
            flat = flat.astype(np.float64)  # keep float32 from overflowing
        # x / bin width truncated toward zero, plus n: a positive x of magnitude bin m
        # lands at n + m, a negative one at n - m (m = n only at |x| = bound: the last
        # bin). Both signs' bin 0 share index n; the negatives' share is their count
        # less their other bins. One bincount over signed indices, in scratch arrays:
        # binning |x| and offsetting the negatives took two passes more (2.6 -> 1.8 ns
        # a value; PP-OCRv4 det --no-latency-aware 20.4 -> 17.8 CPU s). The same counts.
        # (Fresh arrays per slice and ``np.add(..., where=...)`` were 2.9x slower still.)
        size = flat.size
        scaled = np.multiply(flat, flat.dtype.type(scale), out=_scratch(flat.dtype, size))
        index = _scratch(np.dtype(np.intp), size)
        np.copyto(index, scaled, casting="unsafe")  # truncates toward zero
        index += n
        counts = np.bincount(index, minlength=2 * n + 1)
        below = np.less(flat, 0, out=_scratch(np.dtype(np.bool_), size))
        negatives = int(np.count_nonzero(below))  # -0.0 is not negative
        positive, negative = counts[n:], counts[n::-1]  # by m = 0 .. n
        negative_zero = negatives - int(negative[1:].sum())
        self.positive += positive[:n]
        self.positive[n - 1] += positive[n]
        self.positive[0] -= negative_zero
        self.negative += negative[:n]
        self.negative[n - 1] += negative[n]
        self.negative[0] += negative_zero - negative[0]

    def _widen(self, bound: float) -> None:
        """Grow the range to ``bound`` (a power of two), merging bins exactly."""
        if self.bound == 0.0:
            self.bound = bound
            return
        factor = round(bound / self.bound)
        n = self.num_bins
        for name in ("positive", "negative"):
            old = getattr(self, name)
            new = np.zeros(n, dtype=np.int64)
            if factor >= n:
                new[0] = old.sum()
            else:
                new[: n // factor] = old.reshape(n // factor, factor).sum(axis=1)
            setattr(self, name, new)
        self.bound = bound


class _Scratch(threading.local):
    """Per-thread arrays :meth:`_TensorHistogram._bin_slice` works in (one per dtype,
    at least :data:`_BIN_SLICE` long), reused from slice to slice."""

    def __init__(self) -> None:
        self.arrays: dict[np.dtype[Any], np.ndarray] = {}


_SCRATCH = _Scratch()


def _scratch(dtype: np.dtype[Any], size: int) -> np.ndarray:
    """The first ``size`` items of this thread's scratch array of ``dtype``."""
    array = _SCRATCH.arrays.get(dtype)
    if array is None or array.size < size:
        array = _SCRATCH.arrays[dtype] = np.empty(max(size, _BIN_SLICE), dtype=dtype)
    return array[:size]


def _power_of_two_at_least(value: float) -> float:
    mantissa, exponent = math.frexp(value)  # value = mantissa * 2**exponent, 0.5 <= m < 1
    return value if mantissa == 0.5 else math.ldexp(1.0, exponent)


class CalibrationStats:
    """Per-tensor streaming statistics from which quantization ranges are computed.

    Feed activations with :meth:`update` (any number of times, any chunking); ask for a
    range with :meth:`compute_range`. Memory per tensor is two ``num_bins`` histograms,
    whatever the number of samples.
    """

    def __init__(self, num_bins: int = 2048) -> None:
        if num_bins < 16 or num_bins & (num_bins - 1):
            raise ConfigError(
                f"num_bins must be a power of two of at least 16, not {num_bins}",
                hint="use the default 2048 or e.g. 1024, 4096",
            )
        self.num_bins = num_bins
        self._tensors: dict[str, _TensorHistogram] = {}

    def update(self, name: str, values: np.ndarray) -> None:
        """Fold a chunk of tensor ``name`` into its statistics.

        NaN and +/-inf values are ignored (and counted, see :meth:`nonfinite_count`);
        an empty array only registers the name.
        """
        array = np.asarray(values)
        if array.dtype.kind not in "fiub":
            raise DataError(
                f"tensor {name!r} has dtype {array.dtype}, which cannot be calibrated",
                hint="calibrate only numeric (float or integer) tensors",
            )
        if array.dtype.kind != "f" or array.dtype.itemsize < 4:
            array = array.astype(np.float32 if array.dtype.itemsize <= 2 else np.float64)
        histogram = self._tensors.get(name)
        if histogram is None:
            histogram = self._tensors[name] = _TensorHistogram(self.num_bins)
        histogram.add(array)

    def tensor_names(self) -> list[str]:
        """Names of all tensors seen so far, in first-seen order."""
        return list(self._tensors)

    def count(self, name: str) -> int:
        """Number of finite values of ``name`` seen so far."""
        return self._get(name).count

    def nonfinite_count(self, name: str) -> int:
        """Number of NaN/inf values of ``name`` that were ignored."""
        return self._get(name).nonfinite

    def compute_range(
        self,
        name: str,
        algorithm: str,
        *,
        symmetric: bool,
        num_quant_levels: int = 256,
        percentile: float = 99.999,
    ) -> tuple[float, float]:
        """The quantization range ``(lo, hi)`` of tensor ``name``; always lo <= 0 <= hi.

        - ``minmax``: exact extremes of every value seen.
        - ``kl``: the clipping threshold minimizing the KL divergence between the
          histogram and its quantization to ``num_quant_levels`` levels (TensorRT-style
          entropy calibration; half the levels per side for symmetric or mixed-sign
          ranges).
        - ``percentile``: the ``percentile`` of |x| (symmetric), or the lower/upper
          ``100 - percentile`` / ``percentile`` percentiles of x (asymmetric), within one
          histogram bin of the exact value.
        - ``mse``: the clipping threshold minimizing the expected squared error of
          quantize-dequantize (rounding noise inside the range, clipping error outside).

        Algorithms come from the registry in :mod:`.algorithms` (one function each).

        Symmetric ranges are ``(-t, t)``. A tensor of zeros gives ``(0.0, 0.0)``: callers
        turning ranges into scales must handle a zero-width range.
        """
        method = ALGORITHMS.get(algorithm)
        if method is None:
            raise ConfigError(
                f"unknown calibration algorithm {algorithm!r}",
                hint=f"use one of {', '.join(ALGORITHMS)}",
            )
        if num_quant_levels < 4:
            raise ConfigError(f"num_quant_levels must be at least 4, not {num_quant_levels}")
        if not 0.0 < percentile <= 100.0:
            raise ConfigError(f"percentile must be in (0, 100], not {percentile}")
        histogram = self._get(name)
        key = (algorithm, symmetric, num_quant_levels, percentile)
        cached = histogram.ranges.get(key)
        if cached is not None:
            return cached
        if histogram.count == 0:
            what = "only NaN/inf values" if histogram.nonfinite else "no values"
            raise DataError(
                f"tensor {name!r} received {what} during calibration",
                hint="check the calibration data and the model for overflow or NaN inputs",
            )
        lo, hi = method(histogram, symmetric, num_quant_levels, percentile)
        result = (min(float(lo), 0.0), max(float(hi), 0.0))
        histogram.ranges[key] = result
        return result

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the statistics to an ``.npz`` file (atomically), for :meth:`load`.

        Lets a later tuning run compute ranges for new algorithms or schemes without
        running the calibration data through the model again.
        """
        with atomic_write(path, "wb") as handle:
            self.write(handle)

    def write(self, handle: Any) -> None:
        """Write the statistics to an open binary file (the ``.npz`` of :meth:`save`)."""
        tensors: list[list[Any]] = []
        arrays: dict[str, np.ndarray] = {}
        for i, (name, h) in enumerate(self._tensors.items()):
            tensors.append([name, h.minimum, h.maximum, h.count, h.nonfinite, h.bound])
            arrays[f"positive_{i}"] = h.positive
            arrays[f"negative_{i}"] = h.negative
        meta = {"format": _FORMAT, "num_bins": self.num_bins, "tensors": tensors}
        arrays["meta"] = np.array(json.dumps(meta))
        savez: Any = np.savez_compressed  # numpy's stub mistypes **arrays
        savez(handle, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | Any) -> CalibrationStats:
        """Read statistics written by :meth:`save` (a path or an open binary file)."""
        where = os.fspath(path) if isinstance(path, str | os.PathLike) else "a file"
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta.get("format") != _FORMAT:
                    raise ValueError(f"unknown format {meta.get('format')!r}")
                stats = cls(int(meta["num_bins"]))
                for i, (name, lo, hi, count, nonfinite, bound) in enumerate(meta["tensors"]):
                    h = _TensorHistogram(stats.num_bins, lo, hi, count, nonfinite, bound)
                    h.positive = data[f"positive_{i}"].astype(np.int64)
                    h.negative = data[f"negative_{i}"].astype(np.int64)
                    if (
                        h.positive.shape != (stats.num_bins,)
                        or h.negative.shape != h.positive.shape
                    ):
                        raise ValueError(f"histogram of {name!r} has the wrong size")
                    stats._tensors[name] = h
        except (OSError, KeyError, ValueError, TypeError) as error:
            raise DataError(
                f"cannot read calibration statistics from {where!r}: {error}",
                hint="delete the file and calibrate again",
            ) from error
        return stats

    def _get(self, name: str) -> _TensorHistogram:
        try:
            return self._tensors[name]
        except KeyError:
            raise DataError(
                f"no calibration statistics for tensor {name!r}",
                hint="collect statistics for it first (collect_statistics tensor_names)",
            ) from None
