"""Language-model metrics for judging a weight-only quantized model.

Why: LLM users have text, not labels. Perplexity on their text measures the quantized
model alone; next-token top-1 agreement and KL(fp32 || quantized) compare it with the
float model position by position, which is more sensitive for the same number of tokens
and needs no ground truth. All in float64 with a max-shifted log-softmax, since
vocabularies are large and logits of fp16 models can be large.

Conventions: ``logits`` are ``(..., L, V)``; ``token_ids`` ``(..., L)``; the logits at
position ``t`` predict token ``t + 1``, so a window of L tokens gives L - 1 predictions.
For perplexity over many windows, add up :func:`nll_sum` results and call
:func:`perplexity_from_nll` once (the mean of per-window perplexities is not a perplexity).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ..errors import DataError


def log_softmax(logits: npt.ArrayLike, axis: int = -1) -> npt.NDArray[np.float64]:
    """Numerically stable ``log(softmax(logits))`` in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - np.max(z, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def _check_logits(logits: npt.ArrayLike, name: str) -> npt.NDArray[np.float64]:
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim < 2 or 0 in z.shape:
        raise DataError(
            f"{name} must be (..., L, V) with L, V > 0, got shape {z.shape}",
            hint="pass the model's logits output for a window of tokens",
        )
    if not np.all(np.isfinite(z)):
        raise DataError(f"{name} contain NaN or infinity", hint="the model output is broken")
    return z


def nll_sum(
    logits: npt.ArrayLike, token_ids: npt.ArrayLike, mask: npt.ArrayLike | None = None
) -> tuple[float, int]:
    """Sum of negative log-likelihoods of ``token_ids[..., 1:]`` and how many were predicted.

    ``mask`` (same shape as ``token_ids``, optional) marks real tokens; a prediction counts
    only when its target token is real (padding targets are skipped).
    """
    z = _check_logits(logits, "logits")
    ids = np.asarray(token_ids)
    if ids.shape != z.shape[:-1] or not np.issubdtype(ids.dtype, np.integer):
        raise DataError(
            f"token_ids must be integers of shape {z.shape[:-1]} (logits without V), "
            f"got {ids.dtype} {ids.shape}",
            hint="pass the input_ids the logits were computed from",
        )
    vocab = z.shape[-1]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise DataError(f"token ids must be in [0, {vocab}), the logits' vocabulary size")
    if ids.shape[-1] < 2:
        raise DataError(
            "a window needs at least 2 tokens to predict one",
            hint="use windows of L >= 2 tokens",
        )
    logp = log_softmax(z[..., :-1, :])
    targets = ids[..., 1:]
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    if mask is None:
        keep = np.ones(targets.shape, dtype=bool)
    else:
        m = np.asarray(mask)
        if m.shape != ids.shape:
            raise DataError(f"mask must have the shape of token_ids {ids.shape}, got {m.shape}")
        keep = m[..., 1:].astype(bool)
    return float(-np.sum(picked[keep])), int(np.count_nonzero(keep))


def perplexity_from_nll(total_nll: float, count: int) -> float:
    """``exp(total_nll / count)``."""
    if count <= 0:
        raise DataError("no predicted tokens: perplexity is undefined", hint="use more text")
    return math.exp(total_nll / count)


def perplexity(
    logits: npt.ArrayLike, token_ids: npt.ArrayLike, mask: npt.ArrayLike | None = None
) -> float:
    """Perplexity of ``token_ids`` under ``logits``: exp(mean NLL over predicted positions)."""
    return perplexity_from_nll(*nll_sum(logits, token_ids, mask))


def _pair(
    reference: npt.ArrayLike, candidate: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    ref = _check_logits(reference, "reference logits")
    cand = _check_logits(candidate, "candidate logits")
    if ref.shape != cand.shape:
        raise DataError(
            f"reference and candidate logits differ in shape: {ref.shape} vs {cand.shape}",
            hint="run both models on the same token windows",
        )
    return ref, cand


def top1_agreement(reference: npt.ArrayLike, candidate: npt.ArrayLike) -> float:
    """Fraction of positions where both logit arrays pick the same next token."""
    ref, cand = _pair(reference, candidate)
    return float(np.mean(np.argmax(ref, axis=-1) == np.argmax(cand, axis=-1)))


def mean_kl(reference: npt.ArrayLike, candidate: npt.ArrayLike) -> float:
    """Mean over positions of KL(softmax(reference) || softmax(candidate)), in nats."""
    ref, cand = _pair(reference, candidate)
    lp = log_softmax(ref)
    lq = log_softmax(cand)
    kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)
    return float(np.mean(np.maximum(kl, 0.0)))
