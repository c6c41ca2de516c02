"""Latency-aware quantization of one model: whether it runs, the feed it times on, the
cache, then the search.

The one entry :mod:`lpq_onnxrt.passes.static_plan` calls. The measuring feed is at the
batch the user deploys (``latency_batch_size``), decisions are read from the cache (or
derived from a larger plan's) before anything is measured, and a measured decision is
stored for the next run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import lpq
from lpq import ConfigError, OpConfig, TuneConfig

from .. import graph, model_io, ranges
from . import blame, cache, decision, timing

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)


def enabled(options: Mapping[str, Any]) -> bool:
    """The ``latency_aware`` option (default off: a tuning trial must get the ops its
    tune_cfg asks for; ``lpq quantize`` and the ``onnxrt-cpu`` backend profile turn it on)."""
    value = options.get("latency_aware", False)
    if isinstance(value, str):
        value = value.strip().lower()
        if value in ("off", "false", "no", "0"):
            return False
        if value in ("on", "true", "yes", "1", "auto"):
            return True
        raise lpq.ConfigError(
            f"latency_aware must be true or false, not {value!r}", hint="use true or false"
        )
    return bool(value)


def latency_batch_size(options: Mapping[str, Any]) -> int | None:
    """``latency_batch_size`` (or env ``LPQ_LATENCY_BATCH_SIZE``): the batch to time at."""
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


def latency_decision(
    prepared: model_io.PreparedModel,
    tune_cfg: TuneConfig,
    static_ops: Mapping[str, OpConfig],
    calib_dataloader: Iterable[Any],
    fmt: str,
    build: decision.Builder,
    dynamic: list[str],
    error: Callable[[onnx.ModelProto], float],
) -> decision.LatencyDecision:
    """Measure (or read from the cache) which static ops int8 makes slower here, and which
    run faster (or as fast, more faithfully) dynamically quantized."""
    from ..data import batched_feed, input_specs

    options = tune_cfg.options
    feeds = ranges.limited_feeds(prepared.model, calib_dataloader, tune_cfg.calib_sampling_size)
    batch = latency_batch_size(options)
    # At the batch the user deploys: calibration samples stacked (cycled); else the first.
    feed = next(feeds) if batch is None else batched_feed(input_specs(prepared.model), feeds, batch)
    plan = {name: cfg.to_json() for name, cfg in sorted(static_ops.items())}
    context = cache.cache_context(prepared.key, feed, options)
    key = cache.cache_key(context, plan)
    folder = cache.cache_dir(options)
    cached = cache.load_cached(folder, key) or cache.derived(folder, context, plan)
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
    timer = timing.ort_timer(options, budget_s=float(options.get("latency_budget_s", 1.0)))
    # The fp32 side of every comparison, shaped as the candidates are (inner shapes dropped).
    fp32 = graph.drop_inner_shapes(model_io.copy_model(prepared.model))
    blamer = blame.profile_blame(options, feed, fp32, [n for n, _ in ops])
    decided = decision.decide(
        build,
        fp32,
        ops,
        feed,
        formats=formats,
        timer=timer,
        margin=float(options.get("latency_margin", decision.DEFAULT_MARGIN)),
        blame=blamer,
        dynamic=dynamic,
        error=error,
    )
    cache.store(folder, key, decided, context, plan)
    return decided
