"""Output error against fp32: what a latency choice must not cost, and weight error.

Measured on a few calibration batches (spread over all of them), or on whole recorded
streams for a recurrent model (see :mod:`lpq_onnxrt.streams`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .. import batches, ranges, streams
from .timing import measuring_options

if TYPE_CHECKING:
    import onnx

    from lpq import TuneConfig

log = logging.getLogger(__name__)

#: The weights of a dynamic MatMul are quantized per tensor (not per output channel) when
#: that makes their int8 error at most this many times the per-channel error. ORT's
#: dynamic int8 MatMul runs per-tensor scales faster: all-per-tensor MiniLM ran 3.8%
#: faster than per-channel, at embedding cosine 0.963 instead of 0.991. Its well-behaved
#: weights (28 of 36 MatMuls, ratio <= 2.8) lose little per tensor; the FFN output
#: projections (ratio 5-19: a few outlier columns) keep per-channel scales. That mix ran
#: as fast as all-per-tensor at cosine 0.990.
PER_TENSOR_WEIGHT_RATIO = 3.0
#: Calibration batches the output error is measured on.
ERROR_BATCHES = 32
#: ... and at most this many samples of them, where the batches can be cut into samples
#: (the model's inputs and outputs share a symbolic batch axis): as many as batch-1 data
#: gets. PP-OCRv4 rec's 64 calibration samples at batch 32 were two batches and 64
#: samples, and its output errors a third of its quantization time.
ERROR_SAMPLES = 32
#: ... run in batches of this many samples (the range choice measures on parts of them).
ERROR_ROWS = 8
#: Models whose timed runs :meth:`OutputError.observe` keeps: the two of the timer's
#: last comparison (it holds them anyway; more held more quantized copies).
SEEN_MODELS = 2
#: Calibration feeds (whole chains) the output error of a streaming model is measured on.
STREAM_FEEDS = 4 * ERROR_BATCHES


def weight_error_ratio(weight: np.ndarray) -> float:
    """How many times larger a weight's symmetric int8 error (relative L2) is with one
    scale for the whole tensor than with one per output channel (the last axis, as a
    MatMul's B is laid out)."""
    matrix = np.asarray(weight, dtype=np.float64).reshape(-1, np.shape(weight)[-1])

    def error(scale: np.ndarray | float) -> float:
        scale = np.where(np.asarray(scale) > 0, scale, 1.0)
        restored = np.clip(np.round(matrix / scale), -127, 127) * scale
        return float(np.linalg.norm(matrix - restored))

    per_channel = error(np.abs(matrix).max(axis=0, keepdims=True) / 127)
    per_tensor = error(float(np.abs(matrix).max()) / 127)
    return per_tensor / per_channel if per_channel > 0 else 1.0


def spread(feeds: Iterable[Mapping[str, np.ndarray]], count: int) -> list[dict[str, np.ndarray]]:
    """At most ``count`` of ``feeds``, evenly spaced over all of them (the first batches of a
    stream are its start: a VAD's first chunks are near silence)."""
    every = [dict(feed) for feed in feeds]
    if len(every) <= count:
        return every
    return [every[int(i * len(every) / count)] for i in range(count)]


def sample_rows(
    feeds: Sequence[Mapping[str, np.ndarray]], count: int = ERROR_SAMPLES, rows: int = ERROR_ROWS
) -> list[dict[str, np.ndarray]]:
    """At most ``count`` samples (rows of the first axis) of ``feeds``, evenly spaced over
    all of them, in batches of ``rows``; ``feeds`` as they are where they hold no more,
    or where a feed's inputs differ in their first axis (not one batch of samples)."""
    found = [batches.shared_batch(feed) for feed in feeds]
    sizes = [size for size in found if size is not None]
    if len(sizes) < len(found):
        return [dict(feed) for feed in feeds]
    total = sum(sizes)
    if total <= count:
        return [dict(feed) for feed in feeds]
    starts = np.cumsum([0, *sizes])
    picked = [(i * total) // count for i in range(count)]
    out = []
    for begin in range(0, count, rows):
        chosen = picked[begin : begin + rows]
        where = [(int(np.searchsorted(starts, g, side="right")) - 1, g) for g in chosen]
        out.append(
            {
                name: np.stack([np.asarray(feeds[f][name])[g - starts[f]] for f, g in where])
                for name in feeds[0]
            }
        )
    return out


def output_error(
    options: Mapping[str, Any],
    feeds: Sequence[Mapping[str, np.ndarray]],
    fp32_model: onnx.ModelProto,
    found: streams.Streams | None = None,
    part: tuple[int, int] = (0, 1),
    batched: bool | None = None,
) -> OutputError:
    """An ``error`` function: a model's relative L2 output error against fp32 over ``feeds``
    (a few calibration batches; float outputs, pooled), for choices that must not cost
    fidelity. One batch is not enough: a stream's first chunk may be silence.

    With ``found`` (the feeds form streams, see :mod:`lpq_onnxrt.streams`), whole chains
    of ``feeds`` are run, each model feeding its own state back, and the error is that of
    the non-state outputs: what a quantized recurrent model gets wrong in a real stream.

    ``part=(k, n)`` measures on every n-th of those batches or chains from the k-th: n
    disjoint parts, for a choice that must hold on data it was not fitted to.

    ``batched``: whether the model's first axis is a batch of samples (batches then run
    in chunks; see :func:`error_feeds`); None reads it from the declared shapes."""
    return OutputError(options, feeds, fp32_model, found, part, batched)


class OutputError:
    """``error(model)``: a model's output error against fp32 (see :func:`output_error`).

    The fp32 outputs are run once, on the first call, and kept per run (feed or chain
    link) and per compared float output in the dtype ORT returned them (float32: half the
    memory of float64, converted exactly when compared), with each output's squared L2
    norm over all runs. :meth:`lend` hands it a lender of sessions (the latency timer's
    :meth:`~lpq_onnxrt.latency.timing.OrtTimer.session_for`: the same options): a model
    the lender has a session for runs there instead of in a new one (the search asks for
    the error of the two models it has just timed). :meth:`observe` takes the outputs
    of the timer's runs on single samples (:meth:`rows`; see
    :meth:`~lpq_onnxrt.latency.timing.OrtTimer.watch`): the error of a model so timed runs
    only the samples the timer did not."""

    def __init__(
        self,
        options: Mapping[str, Any],
        feeds: Sequence[Mapping[str, np.ndarray]],
        fp32_model: onnx.ModelProto,
        found: streams.Streams | None,
        part: tuple[int, int],
        batched: bool | None = None,
    ) -> None:
        self.options = measuring_options(options)
        self.feeds, self.fp32_model = feeds, fp32_model
        self.links: Mapping[str, int] = {}
        self.compared: set[int] | None = None
        if found is None:  # every feed on its own
            chains: Sequence[Sequence[int]] = [[k] for k in range(len(feeds))]
        else:
            self.links, chains = found.links, found.select(STREAM_FEEDS)
            # The state outputs' errors already show in the outputs they feed.
            outputs = set(range(len(fp32_model.graph.output)))
            self.compared = outputs - set(self.links.values()) or None
        self.chains = chains[part[0] :: part[1]]
        # Plain batches of a model with a batch axis run in chunks (not streams: a
        # chain's state is the whole batch's).
        if batched is None:
            batched = batches.shares_batch_axis(fp32_model)
        self.batched = found is None and batched
        self.reference: list[list[tuple[int, np.ndarray]]] = []
        self.reference_sq: dict[int, float] = {}
        self.sessions: Callable[[onnx.ModelProto], Any] | None = None
        # One sample at a time (see rows()): the feeds, and where each sits (the
        # reference run it is part of, its row there, that run's rows).
        self._rows: list[dict[str, np.ndarray]] | None = None
        self._row_at: list[tuple[int, int, int]] = []
        # Per model (by identity, the last few): squared differences per row and output,
        # from the timer's runs (observe()).
        self._seen: dict[int, tuple[onnx.ModelProto, dict[int, dict[int, float]]]] = {}

    def lend(self, sessions: Callable[[onnx.ModelProto], Any] | None) -> None:
        """Run models in ``sessions(model)`` where it gives one (None: no lender)."""
        self.sessions = sessions

    def timed_rows(self) -> list[dict[str, np.ndarray]]:
        """:meth:`rows`, with the fp32 outputs recorded first (a timer's runs on them are
        read against those from the first run on, not only after the first error read:
        PP-OCRv4 det's first comparisons were otherwise lost to it)."""
        if not self.reference:
            self._record_reference()
        return self.rows()

    def rows(self) -> list[dict[str, np.ndarray]]:
        """The samples this error reads, one at a time (feeds of one row, in order): what
        the latency timer may time on and hand back (:meth:`observe`). Empty for streams,
        and for batches of a model without a batch axis."""
        if self._rows is None:
            self._rows = []
            for position, chain in enumerate([] if self.links else self.chains):
                feed = self.feeds[chain[0]]
                size = batches.shared_batch(feed)
                if size is None or (size > 1 and not self.batched):
                    self._rows, self._row_at = [], []
                    break
                for row in range(size):
                    self._rows.append({n: np.asarray(v)[row : row + 1] for n, v in feed.items()})
                    self._row_at.append((position, row, size))
        return self._rows

    def forget_timed(self) -> None:
        """Drop what :meth:`observe` kept, with the models it holds (the search is over:
        MiniLM's last two held 0.1 GB to the end of the quantize call)."""
        self._seen.clear()

    def forget_timed_except(self, model: onnx.ModelProto) -> None:
        """Drop what :meth:`observe` kept for every model but ``model``, with those models
        (before a profile: the last comparison's other model is seldom asked again, and
        the profile's two sessions come on top of what is held)."""
        found = self._seen.get(id(model))
        self._seen = {id(model): found} if found is not None and found[0] is model else {}

    def observe(self, model: onnx.ModelProto, index: int, outputs: Sequence[Any]) -> None:
        """Keep what ``model``'s outputs on sample ``index`` of :meth:`rows` (a timed run)
        add to its error; its error then runs only the samples not seen. Ignored before
        the fp32 outputs are recorded (the first error read), and for a model whose
        outputs depend on the whole batch where a run holds several samples."""
        if not self.reference or index >= len(self._row_at):
            return
        if self._row_at[index][2] > 1 and batches.batch_wide(model):
            return
        found = self._seen.pop(id(model), None)
        if found is None or found[0] is not model:
            found = (model, {})
        self._seen[id(model)] = found  # the most recently timed last
        while len(self._seen) > SEEN_MODELS:
            del self._seen[next(iter(self._seen))]
        squares = self._row_squares(index, outputs)
        if squares is not None:
            found[1][index] = squares

    def _row_squares(self, index: int, outputs: Sequence[Any]) -> dict[int, float] | None:
        """Per compared output, the squared difference of one sample's outputs from the
        fp32 ones (None: shapes that do not fit its row)."""
        position, row, size = self._row_at[index]
        squares = {}
        for output, value in self.reference[position]:
            got = np.asarray(outputs[output]).ravel()
            width = value.size // size
            if got.size != width or width * size != value.size:
                return None
            part = value[row * width : (row + 1) * width].astype(np.float64)
            squares[output] = _squares(part - got.astype(np.float64))
        return squares

    def __call__(self, model: onnx.ModelProto) -> float:
        # Mean over outputs of each one's relative error: a large recurrent state must not
        # drown the one number a VAD or classifier outputs. Each output's error is
        # ||a - b|| / ||a|| over all runs, its squares summed in float64 run by run.
        if not self.reference:
            self._record_reference()
        found = self._seen.get(id(model))
        if found is not None and found[0] is model and found[1]:
            return self._error(self._from_rows(model, found[1]))
        diff_sq = dict.fromkeys(self.reference_sq, 0.0)
        for expected, got in zip(self.reference, self._outputs(model), strict=True):
            if [index for index, _ in expected] != sorted(got):
                raise ValueError("the model's float outputs differ from the fp32 model's")
            for index, value in expected:
                delta = value.astype(np.float64) - got[index].astype(np.float64)
                diff_sq[index] += _squares(delta)
        return self._error(diff_sq)

    def _error(self, diff_sq: Mapping[int, float]) -> float:
        per = [
            math.sqrt(diff_sq[index]) / max(math.sqrt(total), 1e-30)
            for index, total in sorted(self.reference_sq.items())
        ]
        return float(np.mean(per)) if per else 0.0

    def _from_rows(
        self, model: onnx.ModelProto, seen: Mapping[int, dict[int, float]]
    ) -> dict[int, float]:
        """Squared differences per output over every sample: those the timer's runs
        gave (``seen``), and the others run now, one at a time."""
        diff_sq = dict.fromkeys(self.reference_sq, 0.0)
        session = None
        for index, row in enumerate(self.rows()):
            squares = seen.get(index)
            if squares is None:
                if session is None:
                    session = self._session(model)
                squares = self._row_squares(index, session.run(None, row))
                if squares is None:
                    raise ValueError("the model's outputs do not fit the fp32 model's rows")
            for output, value in squares.items():
                diff_sq[output] += value
        return diff_sq

    def _session(self, model: onnx.ModelProto) -> Any:
        """The lender's session for ``model`` where it has one, else a new one."""
        from ..session import create_session

        lent = self.sessions(model) if self.sessions is not None else None
        return lent if lent is not None else create_session(model, self.options)

    def _record_reference(self) -> None:
        for kept in self._outputs(self.fp32_model):
            # Copied: ORT's outputs are views of its own buffers, and holding them holds
            # the session's memory arena after the session is gone (MTCNN P-Net at batch
            # 32: ~0.3 GB).
            kept = {index: np.array(value, copy=True) for index, value in kept.items()}
            self.reference.append(list(kept.items()))
            for index, value in kept.items():
                wide = value.astype(np.float64)
                self.reference_sq[index] = self.reference_sq.get(index, 0.0) + _squares(wide)

    def _outputs(self, model: onnx.ModelProto) -> Iterator[dict[int, np.ndarray]]:
        """Per run, the float outputs compared (by output index), one run at a time: a
        candidate's outputs are never all held (MTCNN P-Net at batch 32: 32 batches of
        its score maps were 0.9 GB as float64)."""
        from ..streams import iter_chains

        session = self._session(model)
        chunked = self.batched and not batches.batch_wide(model)

        def run(feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            if chunked:
                outputs = batches.run_in_chunks(lambda p: session.run(None, p), feed)
                if outputs is not None:
                    return outputs
            return list(session.run(None, dict(feed)))

        for values in iter_chains(run, self.feeds, self.links, self.chains):
            kept: dict[int, np.ndarray] = {}
            for index, value in enumerate(values):
                array = np.asarray(value)
                if self.compared is not None and index not in self.compared:
                    continue
                if np.issubdtype(array.dtype, np.floating):
                    kept[index] = array.ravel()
            yield kept


def _squares(values: np.ndarray) -> float:
    """The sum of squares of a float64 vector, in numpy's own loop: not BLAS, whose
    threads spin after every call (one call per run and output: ddddocr rec's warm
    quantization took 1.2 CPU s more with ``values @ values``)."""
    return float(np.einsum("i,i->", values, values))


class ErrorFeeds(NamedTuple):
    """What :func:`error_feeds` found: the feeds, their streams (None: independent
    batches) and whether the model's first axis is a batch of samples."""

    feeds: list[dict[str, np.ndarray]]
    found: streams.Streams | None
    batched: bool


def error_feeds(
    model: onnx.ModelProto, tune_cfg: TuneConfig, calib_dataloader: Iterable[Any]
) -> ErrorFeeds:
    """The calibration feeds output errors are measured on: a spread of batches, or, when
    the calibration data was recorded from streams, all of it and its streams (see
    :mod:`lpq_onnxrt.streams`).

    Where the model has a batch axis (:func:`lpq_onnxrt.batches.has_batch_axis`) its
    batches run in chunks, with the same outputs in less time and memory; where it
    declares the axis they are also cut into :data:`ERROR_SAMPLES` samples. Not where
    the axis is only seen by running: a subset reads another error, and nothing says
    it reads the same one. PP-OCRv4 det's cost-bench pages give a text map on 6 of 51
    samples; 32 evenly spaced ones left out the one that held most of the error, the
    search read 1.72 instead of 0.93 and wrote a model at mask IoU 0.11, not 0.80."""
    from ..session import create_session

    feeds = list(ranges.limited_feeds(model, calib_dataloader, tune_cfg.calib_sampling_size))
    session = create_session(model, measuring_options(tune_cfg.options))

    def run(feed: Mapping[str, np.ndarray]) -> list[Any]:
        return list(session.run(None, dict(feed)))

    found = streams.find(run, feeds)
    if found is None:
        chosen = spread(feeds, ERROR_BATCHES)
        batched = bool(chosen) and batches.has_batch_axis(model, run, chosen[0])
        cut = batches.shares_batch_axis(model)
        return ErrorFeeds(sample_rows(chosen) if cut else chosen, None, batched)
    log.info(
        "calibration data is %d stream(s), state %s: output error measured on streams",
        len(found.chains),
        ", ".join(found.links),
    )
    return ErrorFeeds(feeds, found, False)
