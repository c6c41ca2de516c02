"""Latency decisions on disk: keys, load / store, and decisions derived from a larger plan's.

A decision depends on the model, input shapes, machine, requested format and margin (the
*context*) and on the plan; it is stored under a key made of both, so a tuning run and a
later ``lpq quantize`` of the same model pay once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import lpq
from lpq.latency import Step
from lpq.latency.cache import cache_root, machine_identity

from .backend import DEFAULT_MARGIN, LatencyDecision
from .timing import measuring_options

log = logging.getLogger(__name__)

#: 16: core's decision record (lpq.latency.Decision: steps are its Steps, with times,
#: ratios and the ops of each candidate); entries of 15 and older are not read.
_CACHE_FORMAT = "lpq-onnxrt-latency/16"
#: A decision is derived (not measured) only for a plan that leaves out at most this share
#: of a decided plan's ops (at least one): see :func:`derived`.
DERIVE_MAX_SHARE = 0.1


def machine_key(options: Mapping[str, Any]) -> dict[str, Any]:
    """What makes timings of one machine comparable: CPU and its int8 ISA, cores, ORT,
    threads, provider."""
    import onnxruntime

    return {
        **machine_identity(),
        "onnxruntime": onnxruntime.__version__,
        "threads": measuring_options(options).get("intra_op_num_threads", options.get("threads")),
        "providers": list(options.get("providers") or ["CPUExecutionProvider"]),
    }


def cache_dir(options: Mapping[str, Any]) -> Path:
    """``options['latency_cache_dir']``, else ``$LPQ_CACHE_DIR/onnxrt-latency``, else
    ``~/.cache/lpq/onnxrt-latency``."""
    chosen = options.get("latency_cache_dir")
    if chosen:
        return Path(chosen)
    return cache_root() / "onnxrt-latency"


def cache_context(
    model_key: str, feed: Mapping[str, np.ndarray], options: Mapping[str, Any]
) -> dict[str, Any]:
    """What a decision depends on besides the plan: model, input shapes, machine, the
    format asked for and the margin (JSON-normal, so a stored one compares equal)."""
    context = {
        "model": model_key,
        "shapes": {name: list(np.shape(value)) for name, value in sorted(feed.items())},
        "machine": machine_key(options),
        "format": options.get("quant_format", "auto"),
        "margin": float(options.get("latency_margin", DEFAULT_MARGIN)),
    }
    return _json_normal(context)


def _json_normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _digest(value: Any) -> str:
    source = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(source.encode()).hexdigest()


def _context_prefix(context: Mapping[str, Any]) -> str:
    return _digest(context)[:12]


def cache_key(context: Mapping[str, Any], plan: Any) -> str:
    """``<context digest>-<context and plan digest>``: the prefix lets :func:`derived` read
    only the decisions made for this model, input shape and machine."""
    return f"{_context_prefix(context)}-{_digest({**context, 'plan': plan})[:24]}"


def _cached_decision(data: Mapping[str, Any]) -> LatencyDecision:
    return LatencyDecision.from_json(data, cached=True)


def load_cached(folder: Path, key: str) -> LatencyDecision | None:
    path = folder / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _CACHE_FORMAT:
            return None
        return _cached_decision(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def derived(folder: Path, context: Mapping[str, Any], plan: Any) -> LatencyDecision | None:
    """A decision for ``plan`` read off a cached one for a larger plan that quantizes every
    op of ``plan`` the same way (the plan a tuning trial falls ops back from): its fp32
    and dynamic ops among ``plan``'s, its format; nothing measured. Of several, the one
    with the fewest extra ops. None when no such plan was decided.

    A tuning run's fallback trials differ from the default plan by a few ops; measuring
    each afresh took 50-60 s on PP-OCRv4 det, against a 5 s trial. The trial's latency
    is measured anyway, so an op the derived decision should have moved shows there.
    Only a few ops (``DERIVE_MAX_SHARE``): an op type's fallback changes the neighbours
    of what is left. PP-OCRv4 det with every conv fallen back, derived from the all-int8
    plan at batch 8, kept its 58 Adds, Muls and pools int8 between fp32 convs, Q/DQ
    around each: 0.97x fp32; the measured decision moves them to fp32 too."""
    plan = _json_normal(plan)
    best: tuple[int, dict[str, Any]] | None = None
    for path in folder.glob(f"{_context_prefix(context)}-*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        theirs = data.get("plan")
        if data.get("format") != _CACHE_FORMAT or data.get("context") != context:
            continue
        if not isinstance(theirs, dict) or len(theirs) <= len(plan):
            continue
        if len(theirs) - len(plan) > max(1, int(DERIVE_MAX_SHARE * len(theirs))):
            continue
        if any(theirs.get(name) != cfg for name, cfg in plan.items()):
            continue
        if best is None or len(theirs) < best[0]:
            best = (len(theirs), data)
    if best is None:
        return None
    try:
        parent = _cached_decision(best[1])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    change = f"derived from the decision for a plan with {best[0] - len(plan)} more ops"
    fp32_ops = [name for name in parent.fp32_ops if name in plan]
    return LatencyDecision(
        ops=[name for name in parent.ops if name in plan],
        keep_float=fp32_ops,
        variant=parent.quant_format,
        alternative=[name for name in parent.dynamic_ops if name in plan],
        steps=[Step(change, fp32_ops, kept=True)],
        cached=True,
    )


def store(
    folder: Path, key: str, decision: LatencyDecision, context: Mapping[str, Any], plan: Any
) -> None:
    """Write ``decision`` with its context and plan (so :func:`derived` can find it)."""
    entry = {"format": _CACHE_FORMAT, **decision.to_json(), "context": context}
    entry["plan"] = _json_normal(plan)
    try:
        lpq.write_json(folder / f"{key}.json", entry)
    except OSError as exc:  # a read-only cache must not fail quantization
        log.warning("cannot write the latency cache in %s (%s)", folder, exc)
