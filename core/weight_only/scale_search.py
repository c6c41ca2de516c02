"""Per-block scale and zero-point search that keeps zero points integer.

Why: min/max ranges waste levels on a block's outliers. Shrinking the range (and
clipping the outliers) usually lowers the error of the other weights by more than it
costs; the best shrink differs per block. Like llama.cpp's k-quant search, this tries a
grid of shrink factors per (block, column), keeps the one with the smallest
(optionally activation-weighted) squared reconstruction error, then refits the scale by
weighted least squares with the chosen codes fixed. Zero points stay integer (``uint8``)
so the result runs on ONNX Runtime's fast MatMulNBits kernels (float zero points, as
HQQ produces, do not).

``importance`` weights the error per input channel: pass ``E[x_k^2]`` (e.g. the
diagonal of the GPTQ Hessian / 2) to minimise the expected output error of a layer
with uncorrelated inputs; None weights every input equally.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, DataError
from .blocks import (
    BlockQuantized,
    block_view,
    check_bits,
    check_block_size,
    check_weight,
    params_from_range,
    qmax,
)


def _weighted_error(
    blocks: npt.NDArray[np.float64],
    imp: npt.NDArray[np.float64],
    scale: npt.NDArray[np.float64],
    zp: npt.NDArray[np.float64],
    top: int,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Codes and per-(block, column) weighted squared error for given params.

    ``blocks`` (n_blocks, B, N) with padding 0 and ``imp`` (n_blocks, B, 1) 0 on padding.
    """
    q = np.clip(np.rint(blocks / scale[:, None, :]) + zp[:, None, :], 0, top)
    deq = (q - zp[:, None, :]) * scale[:, None, :]
    return q, np.sum(imp * (blocks - deq) ** 2, axis=1)


def block_error(
    weight: npt.ArrayLike, quantized: BlockQuantized, importance: npt.ArrayLike | None = None
) -> float:
    """Total (importance-weighted) squared reconstruction error of a quantized weight."""
    w = check_weight(weight).astype(np.float64)
    diff = (w - quantized.dequantize().astype(np.float64)) ** 2
    if importance is not None:
        diff *= np.asarray(importance, dtype=np.float64)[:, None]
    return float(diff.sum())


def search_scales(
    weight: npt.ArrayLike,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    *,
    importance: npt.ArrayLike | None = None,
    shrink_grid: npt.ArrayLike | None = None,
    refine: bool = True,
) -> BlockQuantized:
    """Quantize a (K, N) weight with per-block searched scales and integer zero points.

    ``shrink_grid`` lists factors in (0, 1] applied to the block's range (default 1.0 down
    to 0.5 in 0.025 steps); 1.0 is always tried, so no block ends worse than RTN.
    """
    bits = check_bits(bits)
    block_size = check_block_size(block_size)
    w = check_weight(weight).astype(np.float64)
    k, n = w.shape
    if importance is None:
        imp_k = np.ones(k)
    else:
        imp_k = np.asarray(importance, dtype=np.float64)
        if imp_k.shape != (k,) or not np.all(np.isfinite(imp_k)) or np.any(imp_k < 0):
            raise DataError(
                f"importance must be K={k} finite non-negative values, got shape {imp_k.shape}",
                hint="pass mean(x**2) per input channel of this layer, or None",
            )
    if shrink_grid is None:
        grid = np.linspace(1.0, 0.5, 21)
    else:
        grid = np.asarray(shrink_grid, dtype=np.float64).ravel()
        if grid.size == 0 or np.any(grid <= 0) or np.any(grid > 1):
            raise ConfigError(
                "shrink_grid must be a non-empty list of factors in (0, 1]",
                hint="e.g. numpy.linspace(1.0, 0.5, 21)",
            )
        grid = np.unique(np.concatenate([grid, [1.0]]))[::-1]
    top = qmax(bits)

    blocks_nan = block_view(w, block_size)
    wmin = np.nanmin(blocks_nan, axis=1)
    wmax = np.nanmax(blocks_nan, axis=1)
    blocks = np.nan_to_num(blocks_nan, nan=0.0)
    imp_pad = np.zeros(blocks.shape[0] * block_size)
    imp_pad[:k] = imp_k
    imp = imp_pad.reshape(blocks.shape[0], block_size, 1)

    best_err = np.full(wmin.shape, np.inf)
    best_s = np.ones(wmin.shape)
    best_z = np.zeros(wmin.shape)
    for r in grid:
        s32, z8 = params_from_range(wmin * r, wmax * r, bits, symmetric)
        s, z = s32.astype(np.float64), z8.astype(np.float64)
        _, err = _weighted_error(blocks, imp, s, z, top)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_z = np.where(better, z, best_z)

    if refine:
        # Least-squares scale for the chosen codes: s* = sum(a w d) / sum(a d^2), d = q - z.
        q, _ = _weighted_error(blocks, imp, best_s, best_z, top)
        d = q - best_z[:, None, :]
        num = np.sum(imp * blocks * d, axis=1)
        den = np.sum(imp * d * d, axis=1)
        s_ls = np.where(den > 0, num / np.where(den > 0, den, 1.0), best_s)
        # Same sign as the chosen scale (the symmetric 4-bit grid's scale is negative
        # where the block's extreme is positive).
        s_ls = np.where(s_ls * best_s > 0, s_ls, best_s).astype(np.float32).astype(np.float64)
        _, err = _weighted_error(blocks, imp, s_ls, best_z, top)
        better = err < best_err
        best_s = np.where(better, s_ls, best_s)

    scales = best_s.astype(np.float32)
    zps = best_z.astype(np.uint8)
    q, _ = _weighted_error(blocks, imp, scales.astype(np.float64), best_z, top)
    codes = q.reshape(-1, n)[:k].astype(np.uint8)
    return BlockQuantized(np.ascontiguousarray(codes), scales, zps, bits, block_size, symmetric)
