"""Streaming activation calibration: minmax, kl (entropy) and percentile ranges.

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

The framework (onnx, onnxruntime) is imported only inside :func:`collect_statistics`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, DataError, ModelError, atomic_write

if TYPE_CHECKING:
    import onnx
    import onnxruntime

ALGORITHMS = ("minmax", "kl", "percentile")
_FORMAT = "lpq-calibration-stats/1"

# Candidate thresholds evaluated in the coarse pass of the KL search; the best one is
# then refined bin by bin. Keeps kl at O(num_bins * _KL_COARSE_STEPS) per tensor.
_KL_COARSE_STEPS = 256
# Models above this size cannot be serialized to one protobuf string (2 GiB limit).
_MAX_INLINE_MODEL_BYTES = 1_800_000_000


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
        finite = np.isfinite(flat)
        if not finite.all():
            self.nonfinite += int(flat.size - np.count_nonzero(finite))
            flat = flat[finite]
        if flat.size == 0:
            return
        self.ranges.clear()
        lo, hi = float(flat.min()), float(flat.max())
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
        n = self.num_bins
        scale = n / self.bound  # a power of two: the multiplication below is exact
        if flat.dtype != np.float64 and not 2.0**-100 < scale < 2.0**100:
            flat = flat.astype(np.float64)  # keep float32 from overflowing
        scaled = flat * flat.dtype.type(scale)
        np.abs(scaled, out=scaled)
        np.minimum(scaled, n - 1, out=scaled)
        index = scaled.astype(np.intp)  # floor of |x| / bin width
        del scaled
        np.add(index, n, out=index, where=flat < 0)  # negatives: second half
        counts = np.bincount(index, minlength=2 * n)
        self.positive += counts[:n]
        self.negative += counts[n:]

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

        Symmetric ranges are ``(-t, t)``. A tensor of zeros gives ``(0.0, 0.0)``: callers
        turning ranges into scales must handle a zero-width range.
        """
        if algorithm not in ALGORITHMS:
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
        if algorithm == "minmax":
            result = _minmax(histogram, symmetric)
        elif algorithm == "percentile":
            result = _percentile_range(histogram, symmetric, percentile)
        else:
            result = _kl_range(histogram, symmetric, num_quant_levels)
        lo, hi = result
        result = (min(float(lo), 0.0), max(float(hi), 0.0))
        histogram.ranges[key] = result
        return result

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the statistics to an ``.npz`` file (atomically), for :meth:`load`.

        Lets a later tuning run compute ranges for new algorithms or schemes without
        running the calibration data through the model again.
        """
        tensors: list[list[Any]] = []
        arrays: dict[str, np.ndarray] = {}
        for i, (name, h) in enumerate(self._tensors.items()):
            tensors.append([name, h.minimum, h.maximum, h.count, h.nonfinite, h.bound])
            arrays[f"positive_{i}"] = h.positive
            arrays[f"negative_{i}"] = h.negative
        meta = {"format": _FORMAT, "num_bins": self.num_bins, "tensors": tensors}
        arrays["meta"] = np.array(json.dumps(meta))
        with atomic_write(path, "wb") as handle:
            savez: Any = np.savez_compressed  # numpy's stub mistypes **arrays
            savez(handle, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CalibrationStats:
        """Read statistics written by :meth:`save`."""
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
                f"cannot read calibration statistics from {os.fspath(path)!r}: {error}",
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


def _minmax(h: _TensorHistogram, symmetric: bool) -> tuple[float, float]:
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


def _percentile_range(
    h: _TensorHistogram, symmetric: bool, percentile: float
) -> tuple[float, float]:
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


def _kl_range(h: _TensorHistogram, symmetric: bool, levels: int) -> tuple[float, float]:
    if h.bound == 0.0:
        return 0.0, 0.0
    one_sided = h.minimum >= 0.0 or h.maximum <= 0.0
    if symmetric or not one_sided:
        t = _kl_threshold(h.magnitudes(), h.bin_width, levels // 2)
        t = min(t, max(-h.minimum, h.maximum))
        if symmetric:
            return -t, t
        return max(h.minimum, -t), min(h.maximum, t)
    # Asymmetric one-signed data (e.g. after ReLU): all levels cover one side.
    if h.minimum >= 0.0:
        return 0.0, min(_kl_threshold(h.positive, h.bin_width, levels), h.maximum)
    return -min(_kl_threshold(h.negative, h.bin_width, levels), -h.minimum), 0.0


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

    def divergence(i: int) -> float:
        reference = counts[:i].copy()
        reference[-1] += suffix[i]
        group = (np.arange(i) * levels) // i
        occupied = (counts[:i] > 0).astype(np.float64)
        group_sum = np.bincount(group, weights=counts[:i], minlength=levels)
        group_occupied = np.bincount(group, weights=occupied, minlength=levels)
        spread = group_sum / np.maximum(group_occupied, 1.0)
        quantized = spread[group] * occupied
        p = reference / reference.sum()
        q = quantized / max(quantized.sum(), 1e-300)
        mask = p > 0
        q_safe = np.maximum(q[mask], 1e-12)  # P mass where Q has none: large, finite cost
        return float(np.sum(p[mask] * np.log(p[mask] / q_safe)))

    step = max(1, (used - levels) // _KL_COARSE_STEPS)
    coarse = [*range(levels, used, step), used]
    best = min(coarse, key=divergence)
    fine = range(max(levels, best - step + 1), min(used, best + step - 1) + 1)
    best = min(fine, key=divergence) if step > 1 else best
    return best * width


#: Default budget for the activations one calibration run may return (bytes).
DEFAULT_MEMORY_BUDGET = 1 << 30
MEMORY_ENV = "LPQ_CALIB_MEMORY_MB"


def memory_budget(options: Mapping[str, Any] | None = None) -> int:
    """Bytes of activations a calibration run may hold: ``options['calibration_memory_mb']``,
    else ``$LPQ_CALIB_MEMORY_MB``, else 1024 MiB."""
    value = (options or {}).get("calibration_memory_mb") or os.environ.get(MEMORY_ENV)
    if value in (None, ""):
        return DEFAULT_MEMORY_BUDGET
    try:
        megabytes = float(value)
    except (TypeError, ValueError):
        megabytes = -1.0
    if megabytes <= 0:
        raise ConfigError(
            f"the calibration memory budget must be a positive number of MiB, not {value!r}",
            hint=f"set calibration_memory_mb (or {MEMORY_ENV}) to e.g. 512",
        )
    return int(megabytes * (1 << 20))


@dataclass
class _Plan:
    """How to run one feed within the budget: samples per run and tensors per run."""

    chunk: int
    groups: list[list[str]]


def _batch_of(feed: Mapping[str, np.ndarray]) -> int | None:
    """The feed's batch size when every non-scalar input leads with the same dimension."""
    leading = {int(np.shape(v)[0]) for v in feed.values() if np.ndim(v) >= 1}
    return leading.pop() if len(leading) == 1 else None


def _slice(feed: Mapping[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {k: (v[start:stop] if np.ndim(v) >= 1 else v) for k, v in feed.items()}


def _plan(per_sample: Mapping[str, int], budget: int, batch: int) -> _Plan:
    """Pack tensors into groups whose bytes for ``chunk`` samples fit ``budget``."""
    total = sum(per_sample.values())
    chunk = max(1, min(batch, budget // max(total, 1)))
    groups: list[list[str]] = [[]]
    used = 0
    for name, size in per_sample.items():
        if groups[-1] and used + size * chunk > budget:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size * chunk
    return _Plan(chunk, groups)


def collect_statistics(
    model: onnx.ModelProto,
    tensor_names: Sequence[str],
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    num_bins: int = 2048,
    session_options: onnxruntime.SessionOptions | None = None,
    show_progress: bool = True,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
) -> CalibrationStats:
    """Run ``model`` on every feed and stream the named tensors into :class:`CalibrationStats`.

    The model is copied and the requested intermediate tensors become graph outputs;
    graph inputs are read from the feeds and initializers from the model itself. The
    session runs on the CPU with graph optimizations disabled, so that intermediate
    tensor names survive; thread and logging settings come from ``session_options``
    (which is not modified).

    Peak memory is bounded by ``memory_budget_bytes`` (plus ORT's own working memory),
    whatever the model, batch or number of samples: the first feed is probed with one
    sample to learn each tensor's bytes per sample; then every feed runs in chunks of
    samples, and when one sample's activations alone exceed the budget, the tensors are
    fetched in groups, one run per group. Outputs are folded into the histograms and
    dropped before the next run.
    """
    import onnx
    from onnx import numpy_helper

    stats = CalibrationStats(num_bins)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    produced = {out for node in graph.node for out in node.output if out}
    unknown = [
        n
        for n in tensor_names
        if n not in produced and n not in initializers and n not in graph_inputs
    ]
    if unknown:
        raise ModelError(
            f"tensors {unknown} are not produced by any top-level node of the model",
            hint="calibrate only names of node outputs, graph inputs or initializers",
        )
    wanted = list(dict.fromkeys(tensor_names))
    for name in wanted:  # weights: one update, no inference needed
        if name in initializers:
            stats.update(name, numpy_helper.to_array(initializers[name]))
    from_feeds = [n for n in wanted if n in graph_inputs]
    from_session = [n for n in wanted if n in produced]

    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    existing = {out.name for out in augmented.graph.output}
    typed = {vi.name: vi for vi in list(augmented.graph.value_info) + list(augmented.graph.output)}
    for name in from_session:
        if name in existing:
            continue
        info = onnx.ValueInfoProto()
        if name in typed:
            info.CopyFrom(typed[name])
        else:
            info.name = name  # ORT infers the type of an untyped graph output
        augmented.graph.output.append(info)

    session = _make_session(augmented, session_options)
    required = {i.name for i in session.get_inputs()}
    count = 0
    plan: _Plan | None = None
    for feed in _with_progress(feeds, show_progress):
        if not isinstance(feed, Mapping):
            raise DataError(
                f"calibration feed #{count} is a {type(feed).__name__}, not a dict",
                hint="yield dicts of model input name to numpy array",
            )
        missing = required - set(feed)
        if missing:
            raise DataError(
                f"calibration feed #{count} lacks model inputs {sorted(missing)}",
                hint=f"the model takes inputs {sorted(required)}",
            )
        for name in from_feeds:
            stats.update(name, np.asarray(feed[name]))
        if from_session:
            run_feed = {k: np.asarray(v) for k, v in feed.items() if k in required}
            batch = _batch_of(run_feed)
            if plan is None:
                plan = _probe(session, from_session, run_feed, batch, memory_budget_bytes, count)
            step = plan.chunk if batch is not None else 1
            for start in range(0, batch or 1, step):
                part = _slice(run_feed, start, start + step) if batch is not None else run_feed
                for group in plan.groups:
                    outputs = _run(session, group, part, count)
                    for name, value in zip(group, outputs):
                        stats.update(name, value)
                    del outputs
        count += 1
    if count == 0:
        raise DataError("the calibration data yielded no feeds", hint="pass at least one sample")
    return stats


def _run(
    session: onnxruntime.InferenceSession, names: list[str], feed: dict[str, np.ndarray], index: int
) -> list[np.ndarray]:
    try:
        return list(session.run(names, feed))
    except Exception as error:  # ORT raises its own untyped exceptions
        raise DataError(
            f"ONNX Runtime could not run calibration feed #{index}: {error}",
            hint="check the input names, shapes and dtypes against the model",
        ) from error


def _probe(
    session: onnxruntime.InferenceSession,
    names: list[str],
    feed: dict[str, np.ndarray],
    batch: int | None,
    budget: int,
    index: int,
) -> _Plan:
    """Bytes per sample of each tensor, from one sample of the first feed."""
    sample = _slice(feed, 0, 1) if batch is not None else feed
    sizes: dict[str, int] = {}
    for name in names:  # one tensor at a time: the probe itself stays within the budget
        (value,) = _run(session, [name], sample, index)
        sizes[name] = int(np.asarray(value).nbytes)
        del value
    return _plan(sizes, budget, batch or 1)


def _make_session(
    model: onnx.ModelProto, options: onnxruntime.SessionOptions | None
) -> onnxruntime.InferenceSession:
    import onnxruntime

    options = _unoptimized_copy(options)
    providers = ["CPUExecutionProvider"]
    try:
        if model.ByteSize() < _MAX_INLINE_MODEL_BYTES:
            return onnxruntime.InferenceSession(
                model.SerializeToString(), options, providers=providers
            )
        with tempfile.TemporaryDirectory(prefix="lpq-calib-") as folder:
            import onnx

            path = os.path.join(folder, "model.onnx")
            onnx.save_model(model, path, save_as_external_data=True, location="model.data")
            return onnxruntime.InferenceSession(path, options, providers=providers)
    except Exception as error:
        raise ModelError(
            f"ONNX Runtime cannot load the model for calibration: {error}",
            hint="check that the model is valid (onnx.checker) and its opset is supported",
        ) from error


# Plain SessionOptions settings carried over from the caller's options.
_COPIED_OPTIONS = (
    "intra_op_num_threads",
    "inter_op_num_threads",
    "execution_mode",
    "log_severity_level",
    "log_verbosity_level",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "use_deterministic_compute",
)


def _unoptimized_copy(
    options: onnxruntime.SessionOptions | None,
) -> onnxruntime.SessionOptions:
    """Fresh session options with graph optimizations off (so tensor names survive).

    A copy, because callers reuse their options for evaluation sessions, which must
    stay optimized.
    """
    import onnxruntime

    fresh = onnxruntime.SessionOptions()
    if options is not None:
        for name in _COPIED_OPTIONS:
            setattr(fresh, name, getattr(options, name))
    fresh.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return fresh


def _with_progress(feeds: Iterable[Any], enabled: bool) -> Iterable[Any]:
    """Yield ``feeds`` while showing a progress bar on an interactive terminal."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield from feeds
        return
    from rich.progress import Progress

    total = len(feeds) if isinstance(feeds, Sized) else None
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("calibrating", total=total)
        for feed in feeds:
            yield feed
            progress.advance(task)
