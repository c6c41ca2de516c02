"""Output error against fp32: what a latency choice must not cost, and weight error.

Measured on a few calibration batches (spread over all of them), or on whole recorded
streams for a recurrent model (see :mod:`lpq_onnxrt.streams`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import ranges, streams
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


def output_error(
    options: Mapping[str, Any],
    feeds: Sequence[Mapping[str, np.ndarray]],
    fp32_model: onnx.ModelProto,
    found: streams.Streams | None = None,
    part: tuple[int, int] = (0, 1),
) -> Callable[[onnx.ModelProto], float]:
    """An ``error`` function: a model's relative L2 output error against fp32 over ``feeds``
    (a few calibration batches; float outputs, pooled), for choices that must not cost
    fidelity. One batch is not enough: a stream's first chunk may be silence.

    With ``found`` (the feeds form streams, see :mod:`lpq_onnxrt.streams`), whole chains
    of ``feeds`` are run, each model feeding its own state back, and the error is that of
    the non-state outputs: what a quantized recurrent model gets wrong in a real stream.

    ``part=(k, n)`` measures on every n-th of those batches or chains from the k-th: n
    disjoint parts, for a choice that must hold on data it was not fitted to."""
    from ..session import create_session
    from ..streams import run_chains

    options = measuring_options(options)
    reference: list[np.ndarray] = []
    if found is None:  # every feed on its own
        links: Mapping[str, int] = {}
        chains = [[k] for k in range(len(feeds))]
        compared = None
    else:
        links, chains = found.links, found.select(STREAM_FEEDS)
        # The state outputs' errors already show in the outputs they feed.
        compared = set(range(len(fp32_model.graph.output))) - set(links.values()) or None
    chains = chains[part[0] :: part[1]]

    def outputs(model: onnx.ModelProto) -> list[np.ndarray]:
        """Per float output, its values over all feeds (flattened, concatenated)."""
        session = create_session(model, options)

        def run(feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            return list(session.run(None, dict(feed)))

        per_output: dict[int, list[np.ndarray]] = {}
        for values in run_chains(run, feeds, links, chains):
            for index, value in enumerate(values):
                array = np.asarray(value)
                if compared is not None and index not in compared:
                    continue
                if np.issubdtype(array.dtype, np.floating):
                    per_output.setdefault(index, []).append(array.astype(np.float64).ravel())
        return [np.concatenate(parts) for _, parts in sorted(per_output.items())]

    def error(model: onnx.ModelProto) -> float:
        # Mean over outputs of each one's relative error: a large recurrent state must not
        # drown the one number a VAD or classifier outputs.
        if not reference:
            reference.extend(outputs(fp32_model))
        got = outputs(model)
        per = [
            float(np.linalg.norm(a - b) / max(float(np.linalg.norm(a)), 1e-30))
            for a, b in zip(reference, got, strict=True)
        ]
        return float(np.mean(per)) if per else 0.0

    return error


def error_feeds(
    model: onnx.ModelProto, tune_cfg: TuneConfig, calib_dataloader: Iterable[Any]
) -> tuple[list[dict[str, np.ndarray]], streams.Streams | None]:
    """The calibration feeds output errors are measured on: a spread of batches, or, when
    the calibration data was recorded from streams, all of it and its streams (see
    :mod:`lpq_onnxrt.streams`)."""
    from ..session import create_session

    feeds = list(ranges.limited_feeds(model, calib_dataloader, tune_cfg.calib_sampling_size))
    session = create_session(model, measuring_options(tune_cfg.options))
    found = streams.find(lambda feed: session.run(None, dict(feed)), feeds)
    if found is None:
        return spread(feeds, ERROR_BATCHES), None
    log.info(
        "calibration data is %d stream(s), state %s: output error measured on streams",
        len(found.chains),
        ", ".join(found.links),
    )
    return feeds, found
