"""Block-wise integer quantization of a weight along its input (K) dimension, and RTN.

Every weight-only algorithm in this package ends in the same format, so it is defined
once here. The weight is laid out as ONNX Runtime's MatMul ``B``: shape ``(K, N)``, K
the input (reduction) dimension, N the output dimension (a torch ``Linear.weight`` is
``(N, K)``: pass its transpose). K is cut into blocks of ``block_size`` consecutive
inputs (the last block may be shorter); each (block, column) pair has one float scale and
one *integer* zero point, which is what ``MatMulNBits`` and torchao's int4 kernels need.

Codes are unsigned, ``0 .. 2**bits - 1``, and dequantize as ``(code - zero_point) * scale``.

- symmetric: ``zero_point = 2**(bits-1)`` (8 for 4-bit, 128 for 8-bit, ORT's default when
  no zero point is given).

  * 4-bit: the *signed-extreme* grid, as ONNX Runtime's own symmetric quantizer: the
    block's value of largest magnitude, sign kept, maps to the most negative code,
    ``scale = extreme / -2**(bits-1)`` (negative when the extreme is positive), so all 16
    codes ``0 .. 15`` (``-8 .. 7`` around the zero point) are used and the extreme
    round-trips exactly. Values on the other side beyond ``7 * |scale|`` are clipped (by
    less than one step). Against ``absmax / 7`` (15 levels) the step is 7/8 as large:
    22-26% lower weight error on SmolLM2's matrices at block 32 (docs/weight-only.md).
  * 8-bit: ``scale = absmax / (2**(bits-1) - 1)`` (codes ``1 .. 255``, no clipping). The
    signed-extreme grid gains only 1/128 of a step at 8 bits: measured, 1-2% lower
    weight error on SmolLM2's projections, but its tied lm_head (Q8_0 source, exactly
    on the absmax/127 grid) fell from 1.0 to 0.986 next-token agreement, so int8 keeps
    the absmax grid.
- asymmetric: the block's range ``[min(w, 0), max(w, 0)]`` is split into ``2**bits - 1``
  steps and the zero point is rounded to an integer; including 0 keeps the zero point in
  range, so RTN's error stays within half a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, DataError

SUPPORTED_BITS = (4, 8)
#: Widths whose symmetric grid is the signed-extreme one (see the module docstring).
SIGNED_EXTREME_BITS = (4,)
_G = TypeVar("_G", bound=np.generic)


@dataclass(frozen=True)
class BlockQuantized:
    """A block-quantized ``(K, N)`` weight.

    ``codes`` (K, N) uint8 in ``0 .. 2**bits - 1``; ``scales`` (n_blocks, N) float32,
    nonzero (negative where the symmetric 4-bit grid's block extreme is positive);
    ``zero_points`` (n_blocks, N) uint8. Row ``b`` of scales/zero points covers inputs
    ``b*block_size .. min((b+1)*block_size, K) - 1``.
    """

    codes: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.float32]
    zero_points: npt.NDArray[np.uint8]
    bits: int
    block_size: int
    symmetric: bool

    @property
    def shape(self) -> tuple[int, int]:
        """(K, N) of the original weight."""
        k, n = self.codes.shape
        return int(k), int(n)

    def dequantize(self) -> npt.NDArray[np.float32]:
        """The float32 (K, N) weight the codes stand for."""
        return dequantize_blocks(self.codes, self.scales, self.zero_points, self.block_size)


def check_bits(bits: int) -> int:
    """Validate ``bits`` (4 or 8: the widths MatMulNBits and torchao run fast)."""
    if (
        isinstance(bits, bool)
        or not isinstance(bits, int | np.integer)
        or bits not in SUPPORTED_BITS
    ):
        raise ConfigError(
            f"weight-only bits must be 4 or 8, got {bits!r}",
            hint="use bits=4 for the smallest model or bits=8 for accuracy-critical layers",
        )
    return int(bits)


def check_block_size(block_size: int) -> int:
    """Validate ``block_size``: a power of two >= 16, as ORT's MatMulNBits requires."""
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, int | np.integer)
        or block_size < 16
        or block_size & (block_size - 1)
    ):
        raise ConfigError(
            f"block_size must be a power of two >= 16, got {block_size!r}",
            hint="common choices are 32, 64 and 128 (smaller blocks: more accurate, larger)",
        )
    return int(block_size)


def check_weight(weight: npt.ArrayLike, name: str = "weight") -> npt.NDArray[np.float32]:
    """Return ``weight`` as a finite float32 (K, N) array, or raise DataError."""
    w = np.asarray(weight)
    if w.ndim != 2 or 0 in w.shape:
        raise DataError(
            f"{name} must be a non-empty 2-D (K, N) array, got shape {w.shape}",
            hint="pass a MatMul B as (K, N); transpose a torch Linear.weight (N, K) first",
        )
    if not np.issubdtype(w.dtype, np.number):
        raise DataError(f"{name} must be numeric, got dtype {w.dtype}")
    w = w.astype(np.float32, copy=False)
    if not np.all(np.isfinite(w)):
        raise DataError(
            f"{name} contains NaN or infinity",
            hint="quantize only a weight that the float model itself can use",
        )
    return w


def n_blocks(k: int, block_size: int) -> int:
    """Number of blocks along K (the last one is padded when K % block_size != 0)."""
    return -(-int(k) // int(block_size))


def qmax(bits: int) -> int:
    """Largest code, ``2**bits - 1``."""
    return (1 << bits) - 1


def block_view(w: npt.NDArray[np.floating], block_size: int) -> npt.NDArray[np.floating]:
    """(K, N) -> (n_blocks, block_size, N), padding K with NaN so reductions can skip it."""
    k, n = w.shape
    nb = n_blocks(k, block_size)
    padded = np.full((nb * block_size, n), np.nan, dtype=w.dtype)
    padded[:k] = w
    return padded.reshape(nb, block_size, n)


def expand_blocks(per_block: npt.NDArray[_G], k: int, block_size: int) -> npt.NDArray[_G]:
    """(n_blocks, N) -> (K, N): repeat each block's row over its inputs."""
    return np.repeat(per_block, block_size, axis=0)[:k]


def params_from_range(
    wmin: npt.NDArray[np.floating],
    wmax: npt.NDArray[np.floating],
    bits: int,
    symmetric: bool,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """Scale and integer zero point for ranges ``[wmin, wmax]`` (any matching shapes).

    Symmetric 4-bit maps the signed extreme (``wmin`` or ``wmax``, whichever has the
    larger magnitude; ``wmin`` on a tie) to code 0, i.e. ``scale = extreme / -8``, which
    is negative when the extreme is positive; symmetric 8-bit uses
    ``max(|wmin|, |wmax|) / 127``. Asymmetric widens the range to include 0 (scale > 0).
    A zero range gets scale 1 so that codes stay finite (every value is then 0 anyway).
    """
    top = qmax(bits)
    if symmetric:
        half = 1 << (bits - 1)
        lo = np.asarray(wmin).astype(np.float64)
        hi = np.asarray(wmax).astype(np.float64)
        if bits in SIGNED_EXTREME_BITS:
            extreme = np.where(np.abs(hi) > np.abs(lo), hi, lo)
            scale = extreme / -half
        else:
            scale = np.maximum(np.abs(lo), np.abs(hi)) / (half - 1)
        zp = np.full(scale.shape, half, dtype=np.uint8)
    else:
        lo = np.minimum(wmin, 0.0).astype(np.float64)
        hi = np.maximum(wmax, 0.0).astype(np.float64)
        scale = (hi - lo) / top
        safe = np.where(scale > 0, scale, 1.0)
        zp = np.clip(np.rint(-lo / safe), 0, top).astype(np.uint8)
    return np.where(scale != 0, scale, 1.0).astype(np.float32), zp


def quantize_with_params(
    w: npt.NDArray[np.floating],
    scales: npt.NDArray[np.floating],
    zero_points: npt.NDArray[np.integer],
    bits: int,
) -> npt.NDArray[np.uint8]:
    """Codes ``clip(round(w / scale) + zp, 0, 2**bits - 1)`` for same-shape arrays."""
    q = np.rint(w / scales) + zero_points.astype(np.float64)
    return np.clip(q, 0, qmax(bits)).astype(np.uint8)


def block_params(
    weight: npt.ArrayLike, bits: int = 4, block_size: int = 32, symmetric: bool = True
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """Min/max (RTN) scales and zero points, each (n_blocks, N)."""
    bits = check_bits(bits)
    block_size = check_block_size(block_size)
    w = check_weight(weight)
    blocks = block_view(w, block_size)
    return params_from_range(np.nanmin(blocks, axis=1), np.nanmax(blocks, axis=1), bits, symmetric)


def quantize_blocks(
    weight: npt.ArrayLike,
    scales: npt.NDArray[np.floating],
    zero_points: npt.NDArray[np.integer],
    bits: int,
    block_size: int,
) -> npt.NDArray[np.uint8]:
    """Codes (K, N) for ``weight`` under given per-block scales and zero points."""
    bits = check_bits(bits)
    block_size = check_block_size(block_size)
    w = check_weight(weight)
    k, n = w.shape
    expected = (n_blocks(k, block_size), n)
    for name, arr in (("scales", scales), ("zero_points", zero_points)):
        if np.shape(arr) != expected:
            raise DataError(
                f"{name} must have shape (n_blocks, N) = {expected} for a ({k}, {n}) weight "
                f"with block_size {block_size}, got {np.shape(arr)}",
                hint="compute them with block_params() for the same weight and block_size",
            )
    return quantize_with_params(
        w,
        expand_blocks(np.asarray(scales), k, block_size),
        expand_blocks(np.asarray(zero_points), k, block_size),
        bits,
    )


def dequantize_blocks(
    codes: npt.NDArray[np.integer],
    scales: npt.NDArray[np.floating],
    zero_points: npt.NDArray[np.integer],
    block_size: int,
) -> npt.NDArray[np.float32]:
    """Float32 (K, N) ``(code - zp) * scale`` from (K, N) codes and (n_blocks, N) params."""
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise DataError(f"codes must be 2-D (K, N), got shape {codes.shape}")
    k, n = codes.shape
    expected = (n_blocks(k, block_size), n)
    if np.shape(scales) != expected or np.shape(zero_points) != expected:
        raise DataError(
            f"scales and zero_points must be (n_blocks, N) = {expected}, got "
            f"{np.shape(scales)} and {np.shape(zero_points)}",
            hint="block_size must be the one the codes were quantized with",
        )
    s = expand_blocks(np.asarray(scales, dtype=np.float32), k, block_size)
    z = expand_blocks(np.asarray(zero_points), k, block_size)
    return ((codes.astype(np.float32) - z.astype(np.float32)) * s).astype(np.float32)


def quantize_rtn(
    weight: npt.ArrayLike, bits: int = 4, block_size: int = 32, symmetric: bool = True
) -> BlockQuantized:
    """Round-to-nearest block quantization with min/max (or absmax) ranges.

    The baseline every other algorithm is measured against, and what they fall back to.
    """
    w = check_weight(weight)
    scales, zps = block_params(w, bits, block_size, symmetric)
    codes = quantize_blocks(w, scales, zps, bits, block_size)
    return BlockQuantized(codes, scales, zps, int(bits), int(block_size), bool(symmetric))
