"""Packing block-quantized weights into ONNX Runtime's ``com.microsoft.MatMulNBits`` layout.

The layout is ORT's contract, not lpq's, so it lives in one place with a numpy reference
(:func:`dequantize_matmulnbits`) that tests compare against ORT itself. For a MatMul
``Y = A @ W`` with ``W`` of shape (K, N), ``n_blocks = ceil(K / block_size)`` and
``blob_size = block_size * bits / 8``:

- ``B``: uint8 ``(N, n_blocks, blob_size)``: column n of W, block by block along K; with
  4 bits two codes per byte, the even K index in the low nibble; with 8 bits one code per
  byte. Inputs past K in the last block are padding (ORT ignores them; lpq writes the
  block's zero point there so they dequantize to 0).
- ``scales``: ``(N, n_blocks)`` in A's float type (ORT also accepts it flattened).
- ``zero_points`` (optional): uint8 ``(N, ceil(n_blocks * bits / 8))``: per column, the
  blocks' zero points packed like B (4 bits: two per byte, low nibble first, each column
  padded to a whole byte); absent means ``2**(bits-1)``, i.e. lpq's symmetric mode.
- attributes ``K``, ``N``, ``bits``, ``block_size`` (and ``accuracy_level``, which is the
  adaptor's choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DataError
from .blocks import BlockQuantized, check_bits, check_block_size, dequantize_blocks, n_blocks


@dataclass(frozen=True)
class MatMulNBitsWeights:
    """The initializers and attributes of one ``MatMulNBits`` node."""

    b: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.float32]
    zero_points: npt.NDArray[np.uint8] | None
    k: int
    n: int
    bits: int
    block_size: int

    def attributes(self) -> dict[str, Any]:
        """The node attributes ``K``, ``N``, ``bits`` and ``block_size``."""
        return {"K": self.k, "N": self.n, "bits": self.bits, "block_size": self.block_size}


def _pack_along_last(values: npt.NDArray[np.uint8], bits: int) -> npt.NDArray[np.uint8]:
    """Pack the last axis ``8 // bits`` values per byte, low bits first (length must fit)."""
    if bits == 8:
        return np.ascontiguousarray(values, dtype=np.uint8)
    low = values[..., 0::2].astype(np.uint8)
    high = values[..., 1::2].astype(np.uint8)
    return np.ascontiguousarray(low | (high << 4), dtype=np.uint8)


def _unpack_along_last(packed: npt.NDArray[np.uint8], bits: int) -> npt.NDArray[np.uint8]:
    """Inverse of :func:`_pack_along_last` (the result has ``8 // bits`` times the length)."""
    if bits == 8:
        return np.asarray(packed, dtype=np.uint8)
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def zero_point_bytes(nb: int, bits: int) -> int:
    """Bytes per column of packed zero points: ``ceil(n_blocks * bits / 8)``."""
    return -(-nb * bits // 8)


def pack_matmulnbits(
    quantized: BlockQuantized, *, with_zero_points: bool | None = None
) -> MatMulNBitsWeights:
    """Lay out ``quantized`` as MatMulNBits ``B``, ``scales`` and ``zero_points``.

    ``with_zero_points`` defaults to ``not quantized.symmetric``: symmetric weights rely
    on ORT's default zero point ``2**(bits-1)`` and skip the input. Passing False for a
    weight whose zero points are not all ``2**(bits-1)`` raises DataError.
    """
    bits = check_bits(quantized.bits)
    block_size = check_block_size(quantized.block_size)
    k, n = quantized.shape
    nb = n_blocks(k, block_size)
    if quantized.scales.shape != (nb, n) or quantized.zero_points.shape != (nb, n):
        raise DataError(
            f"scales/zero_points must be (n_blocks, N) = {(nb, n)}, got "
            f"{quantized.scales.shape} and {quantized.zero_points.shape}",
            hint="build BlockQuantized with the block_size its scales were computed for",
        )
    if with_zero_points is None:
        with_zero_points = not quantized.symmetric
    default_zp = 1 << (bits - 1)
    if not with_zero_points and np.any(quantized.zero_points != default_zp):
        raise DataError(
            f"zero points differ from {default_zp}, so MatMulNBits needs its zero_points input",
            hint="pass with_zero_points=True (or leave it at its default)",
        )
    # Pad K with each block's zero point so padded inputs dequantize to exactly 0.
    codes = np.empty((nb * block_size, n), dtype=np.uint8)
    codes[:k] = quantized.codes
    codes[k:] = quantized.zero_points[-1]
    b = _pack_along_last(codes.T, bits).reshape(n, nb, block_size * bits // 8)
    scales = np.ascontiguousarray(quantized.scales.T, dtype=np.float32)
    zps: npt.NDArray[np.uint8] | None = None
    if with_zero_points:
        per_col = zero_point_bytes(nb, bits) * 8 // bits
        zp_cols = np.zeros((n, per_col), dtype=np.uint8)
        zp_cols[:, :nb] = quantized.zero_points.T
        zps = _pack_along_last(zp_cols, bits)
    return MatMulNBitsWeights(np.ascontiguousarray(b), scales, zps, k, n, bits, block_size)


def unpack_matmulnbits(
    b: npt.NDArray[np.uint8],
    scales: npt.NDArray[np.floating],
    zero_points: npt.NDArray[np.uint8] | None,
    k: int,
    n: int,
    bits: int,
    block_size: int,
) -> BlockQuantized:
    """Read MatMulNBits initializers back into a :class:`BlockQuantized` (K, N) weight.

    ``scales`` may be (N, n_blocks) or flat; ``zero_points`` may be (N, bytes) or flat,
    or None (then every zero point is ``2**(bits-1)`` and the result is symmetric).
    """
    bits = check_bits(bits)
    block_size = check_block_size(block_size)
    nb = n_blocks(k, block_size)
    blob = block_size * bits // 8
    b = np.asarray(b)
    if b.dtype != np.uint8 or b.shape != (n, nb, blob):
        raise DataError(
            f"B must be uint8 (N, n_blocks, blob_size) = {(n, nb, blob)}, got {b.dtype} {b.shape}",
            hint="K, N, bits and block_size must be the node's attributes",
        )
    s = np.asarray(scales, dtype=np.float32)
    if s.size != n * nb:
        raise DataError(
            f"scales must hold N * n_blocks = {n * nb} values, got shape {s.shape}",
            hint="scales is (N, n_blocks) or its flattening",
        )
    codes = _unpack_along_last(b.reshape(n, nb * blob), bits)[:, :k].T
    zbytes = zero_point_bytes(nb, bits)
    if zero_points is None:
        zp = np.full((nb, n), 1 << (bits - 1), dtype=np.uint8)
    else:
        zp_packed = np.asarray(zero_points)
        if zp_packed.dtype != np.uint8 or zp_packed.size != n * zbytes:
            raise DataError(
                f"zero_points must be uint8 with N * ceil(n_blocks * bits / 8) = {n * zbytes} "
                f"values, got {zp_packed.dtype} {zp_packed.shape}",
                hint="float zero points are not supported: they leave ORT's fast kernels",
            )
        zp = _unpack_along_last(zp_packed.reshape(n, zbytes), bits)[:, :nb].T
    return BlockQuantized(
        np.ascontiguousarray(codes, dtype=np.uint8),
        np.ascontiguousarray(s.reshape(n, nb).T),
        np.ascontiguousarray(zp),
        bits,
        block_size,
        zero_points is None,
    )


def dequantize_matmulnbits(
    b: npt.NDArray[np.uint8],
    scales: npt.NDArray[np.floating],
    zero_points: npt.NDArray[np.uint8] | None,
    k: int,
    n: int,
    bits: int,
    block_size: int,
) -> npt.NDArray[np.float32]:
    """The float32 (K, N) weight a MatMulNBits node multiplies by: the numpy reference."""
    q = unpack_matmulnbits(b, scales, zero_points, k, n, bits, block_size)
    return dequantize_blocks(q.codes, q.scales, q.zero_points, block_size)
