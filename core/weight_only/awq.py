"""AWQ: activation-aware per-input-channel scaling before weight quantization.

Why: a few input channels of an LLM layer carry much larger activations than the rest,
and the rounding error of their weights dominates the output error. Multiplying those
weight rows by ``s > 1`` (and dividing the activations by ``s``, which leaves the float
output unchanged) gives them a relatively finer grid (Lin et al., 2023). The scales are
``s = mean|x| ** alpha`` per input channel, with ``alpha`` in [0, 1] searched on the
layer's own output error ``|| X W - (X / s) Q(s * W) ||``; ``alpha = 0`` is plain RTN, so
the search never does worse than RTN on the calibration activations.

The adaptor must fold ``1 / s`` into whatever produces the layer's input (a LayerNorm /
RMSNorm weight, a previous Linear's output rows) and quantize ``s * W``; this module
returns ``s`` and the quantized scaled weight, and touches no graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, DataError
from .blocks import BlockQuantized, check_weight, quantize_rtn


@dataclass(frozen=True)
class AWQResult:
    """The chosen ``alpha``, per-input scales ``s`` (K,), ``Q(s * W)`` and the search's
    mean squared output error for every alpha tried (``alphas[i]`` -> ``errors[i]``)."""

    alpha: float
    scales: npt.NDArray[np.float32]
    quantized: BlockQuantized
    alphas: npt.NDArray[np.float64]
    errors: npt.NDArray[np.float64]


def check_activations(x: npt.ArrayLike, k: int) -> npt.NDArray[np.float64]:
    """Calibration activations ``(..., K)`` as a finite float64 (M, K) matrix."""
    a = np.asarray(x)
    if a.ndim < 1 or a.shape[-1] != k or a.size == 0:
        raise DataError(
            f"activations must be a non-empty (..., K) array with K={k}, got shape {a.shape}",
            hint="pass the input of the MatMul/Linear being quantized (a sample of tokens)",
        )
    a = a.reshape(-1, k).astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise DataError("activations contain NaN or infinity", hint="check the calibration data")
    return a


def awq_scales(mean_abs: npt.ArrayLike, alpha: float) -> npt.NDArray[np.float32]:
    """``s = mean|x| ** alpha``, normalized so ``max(s) * min(s) = 1`` (as AWQ does).

    Channels with zero activation get the smallest positive scale (their weights never
    matter on calibration data; a finite scale keeps the folding well defined).
    """
    m = np.asarray(mean_abs, dtype=np.float64)
    positive = m[m > 0]
    if positive.size == 0:
        return np.ones(m.shape, dtype=np.float32)
    m = np.where(m > 0, m, positive.min())
    s = m ** float(alpha)
    s = s / np.sqrt(s.max() * s.min())
    return s.astype(np.float32)


def apply_awq_scales(
    weight: npt.ArrayLike, x: npt.ArrayLike, scales: npt.ArrayLike
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """``(s * W, X / s)``: the transformation AWQ applies before quantizing (exact in real
    arithmetic: ``(X / s) @ (s * W) == X @ W``)."""
    s = np.asarray(scales, dtype=np.float32)
    w = np.asarray(weight, dtype=np.float32)
    return (w * s[:, None]).astype(np.float32), (np.asarray(x, dtype=np.float32) / s).astype(
        np.float32
    )


def output_error(
    x: npt.NDArray[np.floating], reference: npt.NDArray[np.floating], w: npt.NDArray[np.floating]
) -> float:
    """Mean squared difference between ``x @ w`` and a reference output (accumulated in
    float64 whatever the inputs' type)."""
    return float(np.mean(np.square(x @ w - reference), dtype=np.float64))


def awq_search(
    weight: npt.ArrayLike,
    x: npt.ArrayLike,
    bits: int = 4,
    block_size: int = 128,
    symmetric: bool = True,
    *,
    n_grid: int = 20,
) -> AWQResult:
    """Search ``alpha`` over ``n_grid + 1`` points of [0, 1] on calibration activations ``x``.

    ``x`` is a sample of the layer's inputs ``(..., K)``; a few hundred tokens suffice and
    keep the search cheap (each alpha costs one RTN and one ``x @ W``).
    """
    w = check_weight(weight).astype(np.float64)
    k = w.shape[0]
    a = check_activations(x, k)
    if isinstance(n_grid, bool) or not isinstance(n_grid, int) or n_grid < 1:
        raise ConfigError(f"n_grid must be a positive integer, got {n_grid!r}", hint="e.g. 20")
    mean_abs = np.mean(np.abs(a), axis=0)
    # the outputs compared in float32: the weights are float32 and the errors only rank
    # the alphas; float64 products made the search 2x slower (7.5 s for SmolLM2's
    # gate/up pair of a layer on a shared core)
    a32 = a.astype(np.float32)
    reference = a32 @ w.astype(np.float32)
    alphas = np.linspace(0.0, 1.0, n_grid + 1)
    errors = np.empty_like(alphas)
    best: tuple[float, int, npt.NDArray[np.float32], BlockQuantized] | None = None
    for i, alpha in enumerate(alphas):
        s = awq_scales(mean_abs, float(alpha))
        q = quantize_rtn(w * s[:, None], bits, block_size, symmetric)
        errors[i] = output_error(a32 / s, reference, q.dequantize())
        if best is None or errors[i] < best[0]:
            best = (float(errors[i]), i, s, q)
    assert best is not None
    _, i_best, s_best, q_best = best
    return AWQResult(float(alphas[i_best]), s_best, q_best, alphas, errors)
