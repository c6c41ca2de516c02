"""Feeds for decoder-only language models exported with a KV cache.

Users of an LLM hold token windows (``tokens.npz`` with ``input_ids`` (N, L) int64),
not the dozens of inputs an export takes: onnxruntime-genai's builder and ``optimum``
add ``attention_mask`` (N, past + L), often ``position_ids`` (N, L), and one cache tensor
per layer and kind (``past_key_values.{i}.key`` / ``.value``, shaped (N, kv_heads, past,
head_dim); older exports ``past_key_values.{i}`` shaped (2, N, heads, past, head_dim)).
Calibration and evaluation run each window from an empty cache, so lpq fills those
inputs itself: a mask of ones, positions ``0 .. L-1`` and caches with a past length of 0.

Nothing here imports onnxruntime; :func:`lpq_onnxrt.data.make_feed` calls
:func:`fill_decoder_inputs` when a feed names ``input_ids`` but not the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import DataError

if TYPE_CHECKING:
    from .data import InputSpec

TOKENS = "input_ids"
MASK = "attention_mask"
POSITIONS = "position_ids"
_PAST = re.compile(r"^(past_key_values|past)[._]|^past_(key|value)")


def is_cache_input(name: str) -> bool:
    """Whether ``name`` is a KV-cache input (``past_key_values.*``, ``past.*``, ...)."""
    return bool(_PAST.match(name))


def fillable(name: str) -> bool:
    """Inputs lpq can derive from ``input_ids`` for a window run from an empty cache."""
    return name in (MASK, POSITIONS) or is_cache_input(name)


def is_decoder(specs: Sequence[InputSpec]) -> bool:
    """A model that takes ``input_ids`` and only inputs lpq can fill besides it."""
    names = [spec.name for spec in specs]
    return TOKENS in names and len(names) > 1 and all(n == TOKENS or fillable(n) for n in names)


def _empty_cache(spec: InputSpec, batch: int) -> np.ndarray:
    """A zero-length cache: the first symbolic dim is the batch, other symbolic dims 0."""
    if spec.shape is None:
        raise DataError(
            f"cache input {spec.name!r} has no declared shape, so lpq cannot build an empty "
            "cache for it",
            hint="feed it yourself, or re-export the model with shaped inputs",
        )
    dims: list[int] = []
    batch_seen = False
    for dim in spec.shape:
        if dim is not None:
            dims.append(dim)
        elif not batch_seen:
            dims.append(batch)
            batch_seen = True
        else:
            dims.append(0)
    return np.zeros(dims, dtype=spec.dtype)


def fill_decoder_inputs(
    specs: Sequence[InputSpec], feed: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """``feed`` (holding ``input_ids``) with the mask, positions and empty caches added.

    A given ``attention_mask`` is kept (padded windows) and positions follow it
    (``cumsum(mask) - 1``, as Hugging Face does); inputs the feed already has are kept.
    """
    out = {name: np.asarray(value) for name, value in feed.items()}
    ids = out.get(TOKENS)
    if ids is None or ids.ndim != 2:
        shape = None if ids is None else ids.shape
        raise DataError(
            f"a decoder model needs input_ids shaped (N, L) to fill its other inputs, got {shape}",
            hint="save token windows as numpy.savez('tokens.npz', input_ids=ids) with ids "
            "an int64 (N, L) array",
        )
    batch, length = ids.shape
    for spec in specs:
        if spec.name in out:
            continue
        if spec.name == MASK:
            out[MASK] = np.ones((batch, length), dtype=spec.dtype)
        elif spec.name == POSITIONS:
            mask = out.get(MASK)
            if mask is not None and np.shape(mask) == (batch, length):
                pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
            else:
                pos = np.broadcast_to(np.arange(length), (batch, length))
            out[POSITIONS] = np.ascontiguousarray(pos, dtype=spec.dtype)
        elif is_cache_input(spec.name):
            out[spec.name] = _empty_cache(spec, batch)
    return out


def decode_feed(specs: Sequence[InputSpec], past: int) -> dict[str, np.ndarray] | None:
    """One generation step at batch 1: a single new token after ``past`` cached ones.

    This is what a decoder's latency means to its user (tokens per second once the
    prompt is in), and it is not what a window from an empty cache costs: on SmolLM2 the
    int4/int8 mixes decode 2.8x faster than fp32 but run a 256-token window about as fast.
    The values are zeros (a step costs the same whatever the tokens and the cache hold).
    ``None`` for a model without cache inputs, when a cache input's shape leaves the past
    length ambiguous (not exactly one symbolic dim besides the batch) or when an input is
    neither the tokens nor fillable.
    """
    if not any(is_cache_input(spec.name) for spec in specs):
        return None  # no KV cache (an encoder taking input_ids): no generation step
    feed: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.name == TOKENS:
            feed[TOKENS] = np.zeros((1, 1), dtype=spec.dtype)
        elif spec.name == MASK:
            feed[MASK] = np.ones((1, past + 1), dtype=spec.dtype)
        elif spec.name == POSITIONS:
            feed[POSITIONS] = np.full((1, 1), past, dtype=spec.dtype)
        elif is_cache_input(spec.name) and spec.shape is not None:
            symbolic = [i for i, dim in enumerate(spec.shape) if dim is None]
            if len(symbolic) != 2:
                return None
            past_axis = symbolic[1]  # the first symbolic dim is the batch (1)
            dims = [1 if d is None else d for d in spec.shape]
            dims[past_axis] = past
            feed[spec.name] = np.zeros(dims, dtype=spec.dtype)
        else:
            return None
    return feed
