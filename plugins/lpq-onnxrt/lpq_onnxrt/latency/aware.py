"""Latency-aware quantization of one model: whether it runs, the feed it times on, the
cache, the op latency table, then the search.

The one entry :mod:`lpq_onnxrt.passes.static_plan` calls. The measuring feed is at the
batch the user deploys: ``latency_batch_size``, else **one sample** (the first of the
calibration data), as lpq-tf and lpq-mxnet time; decisions are read from the cache (or
derived from a larger plan's) before anything is measured, op types are decided from
the op latency table (:mod:`lpq.latency.table`) where it can, and a measured decision is
stored for the next run.

Why one sample and not the calibration batch: the calibration batch is how the data is
read (``lpq quantize --batch-size``, 32 by default), not how the model is served, and
every timed run costs in proportion to it (MTCNN P-Net at 32 x 320 x 240: 0.2-0.45 s a
run, 79 CPU s to quantize a 28 KB model; at one sample, a few ms). Which op wins does
change with the batch (at batch 8 the PP-OCR detector keeps other ops fp32 than at 1):
whoever serves batches sets ``latency_batch_size``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lpq import ConfigError, OpConfig, TuneConfig
from lpq.latency import decide

# The ``latency_aware`` option is read as every adaptor reads it (core's; its own reading
# here differed only where core raised: None was off, any other non-string its truth).
# Imported under this module's name: the static plan calls ``aware.enabled``.
from lpq.latency import enabled as enabled

from .. import graph, model_io, ranges
from . import backend, blame, cache, signature, timing

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)


def latency_batch_size(options: Mapping[str, Any]) -> int | None:
    """``latency_batch_size`` (or env ``LPQ_LATENCY_BATCH_SIZE``): the batch to time at;
    None when unset (then one sample: see the module doc)."""
    value = options.get("latency_batch_size") or os.environ.get("LPQ_LATENCY_BATCH_SIZE")
    if value in (None, "", 0, "0"):
        return None
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise ConfigError(
            f"latency_batch_size must be a whole number >= 1, not {value!r}",
            hint="set it to the batch size the model is deployed at (e.g. 8)",
        )
    return size


def one_sample(
    specs: Iterable[Any], feed: Mapping[str, Any], loader_batch: Any = None
) -> dict[str, Any]:
    """One sample of the calibration batch ``feed``: each input cut to 1 on its batch axis.

    The batch axis is an input's first symbolic dimension, but only where it holds the
    loader's batch (``loader_batch``, when the loader says it; else where it is axis 0 of
    some input, the size found there; a short batch, where there are fewer samples than
    the loader's batch, by its size on axis 0): ddddocr's recognizer is ``[1, 1, 64, W]``,
    and its first symbolic dimension is the image's width, not a batch. An input with no
    such axis (a fixed batch, a sample rate) is kept whole."""
    import numpy as np

    axes: dict[str, int] = {}
    for spec in specs:
        if spec.shape is not None and spec.name in feed:
            axis = next((i for i, d in enumerate(spec.shape) if d is None), None)
            if axis is not None and np.ndim(feed[spec.name]) > axis:
                axes[spec.name] = axis
    size = loader_batch if isinstance(loader_batch, int) and loader_batch > 0 else None
    at_zero = [np.shape(feed[name])[0] for name, axis in axes.items() if axis == 0]
    if size is None:
        size = at_zero[0] if at_zero else None
    elif all(np.shape(feed[name])[axis] != size for name, axis in axes.items()):
        # fewer samples than the loader's batch: the one batch is short (16 samples at
        # --batch-size 32 came as one batch of 12 after the held-out four, and were timed
        # whole while the fidelity check timed one sample)
        size = next((found for found in at_zero if found < size), None)
    out = dict(feed)
    if size is None or size <= 1:
        return out
    for name, axis in axes.items():
        if np.shape(feed[name])[axis] == size:
            out[name] = np.take(np.asarray(feed[name]), [0], axis=axis)
    return out


def latency_decision(
    prepared: model_io.PreparedModel,
    tune_cfg: TuneConfig,
    static_ops: Mapping[str, OpConfig],
    calib_dataloader: Iterable[Any],
    fmt: str,
    build: backend.Builder,
    dynamic: list[str],
    error: Callable[[onnx.ModelProto], float],
) -> backend.LatencyDecision:
    """Measure (or read from the cache) which static ops int8 makes slower here, and which
    run faster (or as fast, more faithfully) dynamically quantized."""
    from ..data import batched_feed, input_specs

    options = tune_cfg.options
    feeds = ranges.limited_feeds(prepared.model, calib_dataloader, tune_cfg.calib_sampling_size)
    batch = latency_batch_size(options)
    # At the batch the user deploys: calibration samples stacked (cycled); else one sample
    # of the first batch (an input whose batch is fixed keeps it).
    specs = input_specs(prepared.model)
    if batch is None:
        feed = one_sample(specs, next(feeds), getattr(calib_dataloader, "batch_size", None))
    else:
        feed = batched_feed(specs, feeds, batch)
    plan = {name: cfg.to_json() for name, cfg in sorted(static_ops.items())}
    context = cache.cache_context(prepared.key, feed, options)
    key = cache.cache_key(context, plan)
    cache_folder = cache.cache_dir(options)
    cached = cache.load_cached(cache_folder, key) or cache.derived(cache_folder, context, plan)
    if cached is not None:
        log.info("latency decisions from the cache (%d ops kept fp32)", len(cached.fp32_ops))
        return cached
    ops = [(name, op_type) for (name, op_type) in tune_cfg.ops if name in static_ops]
    formats = ("qdq", "qoperator") if fmt == "auto" else (fmt,)
    log.info(
        "latency-aware: measuring which of %d ops int8 makes faster here (%s; input %s)",
        len(ops),
        " and ".join(formats),
        ", ".join(f"{k} {list(v.shape)}" for k, v in sorted(feed.items())),
    )
    table = op_table(prepared.model, static_ops, feed, options)
    with tempfile.TemporaryDirectory(prefix="lpq-fp32-") as folder:
        # The fp32 side of every comparison, shaped as the candidates are (inner shapes
        # dropped), on disk: ORT opens it from there (see model_io.ModelFile).
        fp32 = model_io.ModelFile.write(
            graph.drop_inner_shapes(model_io.copy_model(prepared.model)), folder
        )
        decided = _search(options, table, feed, ops, formats, fp32, build, dynamic, error)
    cache.store(cache_folder, key, decided, context, plan)
    return decided


def _search(
    options: Mapping[str, Any],
    table: blame.TableParts | None,
    feed: Mapping[str, np.ndarray],
    ops: list[tuple[str, str]],
    formats: tuple[str, ...],
    fp32: model_io.ModelFile,
    build: backend.Builder,
    dynamic: list[str],
    error: Callable[[onnx.ModelProto], float],
) -> backend.LatencyDecision:
    """Core's search (:func:`lpq.latency.decide`) on lpq-onnxrt's backend: the ORT
    timer, the profiler and op latency table, the output error."""
    budget = float(options.get("latency_budget_s", timing.DEFAULT_BUDGET_S))
    timer = timing.ort_timer(options, budget_s=budget)
    blamer = blame.profile_blame(options, feed, fp32, [n for n, _ in ops], table)
    release = getattr(timer, "release", None)
    forget = getattr(error, "forget_timed_except", None)
    if blamer is not None and release is not None:

        def before_profile(model: onnx.ModelProto) -> None:
            release()
            if forget is not None:
                forget(model)

        blamer.before_profile = before_profile
    searched = backend.OrtBackend(
        build,
        fp32,
        ops,
        feed,
        formats=formats,
        timer=timer,
        dynamic=dynamic,
        error=error,
        blame=blamer,
        verdict=getattr(blamer, "verdict", None),
        slowdown=getattr(blamer, "slowdown", None),
        gain_bound=getattr(blamer, "gain_bound", None),
    )
    margin = float(options.get("latency_margin", backend.DEFAULT_MARGIN))
    with searched.sessions_lent():
        decided = backend.LatencyDecision.of(decide(searched, margin=margin, log=log.info))
    if table is not None:
        log.info(
            "op latency table: %d hit(s), %d miss(es), %d profile(s)",
            table.table.hits,
            table.table.misses,
            getattr(blamer, "profiles", 0),
        )
    return decided


def op_table(
    model: onnx.ModelProto,
    static_ops: Mapping[str, OpConfig],
    feed: Mapping[str, Any],
    options: Mapping[str, Any],
) -> blame.TableParts | None:
    """This machine's op latency table and the signatures of ``static_ops`` at ``feed``;
    None with ``latency_table: false``."""
    from lpq.latency.table import LatencyTable, machine

    if str(options.get("latency_table", True)).strip().lower() in ("false", "off", "no", "0"):
        return None
    found = cache.machine_key(options)
    key = machine(
        framework="onnxrt",
        framework_version=f"{found['onnxruntime']} {' '.join(found['providers'])}",
        threads=found["threads"],
    )
    return blame.TableParts(
        LatencyTable.open(options, key), signature.signatures(model, static_ops, feed)
    )
