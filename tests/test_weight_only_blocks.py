"""Block-wise RTN quantization (lpq.weight_only.blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from lpq.errors import ConfigError, DataError
from lpq.weight_only import block_params, dequantize_blocks, quantize_blocks, quantize_rtn


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("k", [64, 70])
def test_rtn_round_trip_within_half_a_step(bits: int, symmetric: bool, k: int) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, 24)).astype(np.float32)
    w[:, 3] += 2.0  # an all-positive column: asymmetric ranges must still include 0
    q = quantize_rtn(w, bits=bits, block_size=32, symmetric=symmetric)
    assert q.codes.shape == (k, 24) and q.scales.shape == (-(-k // 32), 24)
    assert q.codes.dtype == np.uint8 and q.zero_points.dtype == np.uint8
    assert q.codes.max() <= 2**bits - 1
    step = np.abs(np.repeat(q.scales, 32, axis=0)[:k])
    err = np.abs(q.dequantize() - w)
    if symmetric and bits == 4:
        # The signed-extreme grid: values inside [-8, 7] steps round to the nearest
        # level; the other side's tail beyond 7 steps is clipped by less than one step.
        ratio = w / np.repeat(q.scales, 32, axis=0)[:k]
        inside = ratio <= 7.5
        assert np.all(err[inside] <= 0.5 * step[inside] * (1 + 1e-5) + 1e-7)
        assert np.all(err <= step * (1 + 1e-5) + 1e-7)
    else:
        assert np.all(err <= 0.5 * step * (1 + 1e-5) + 1e-7)
    if symmetric:
        assert np.all(q.zero_points == 2 ** (bits - 1))


def _signed_extreme_reference(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Plain numpy, one block at a time: int codes in [-8, 7] and the block's scale,
    ``scale = extreme / -8`` with ``extreme`` the block's value of largest magnitude."""
    k, n = w.shape
    codes = np.zeros((k, n), dtype=np.int64)
    scales = np.zeros((-(-k // block), n))
    for b in range(scales.shape[0]):
        part = w[b * block : (b + 1) * block].astype(np.float64)
        for j in range(n):
            lo, hi = part[:, j].min(), part[:, j].max()
            extreme = hi if abs(hi) > abs(lo) else lo
            scale = np.float32(extreme / -8.0) if extreme != 0 else np.float32(1.0)
            scales[b, j] = scale
            codes[b * block : (b + 1) * block, j] = np.clip(
                np.rint(part[:, j] / np.float64(scale)), -8, 7
            )
    return codes, scales


def _absmax7_error(w: np.ndarray, block: int) -> float:
    """Squared error of lpq's former symmetric int4 grid (absmax -> +-7, 15 levels)."""
    total = 0.0
    for b in range(-(-w.shape[0] // block)):
        part = w[b * block : (b + 1) * block].astype(np.float64)
        scale = np.abs(part).max(axis=0) / 7.0
        scale = np.where(scale > 0, scale, 1.0)
        total += float(((np.clip(np.rint(part / scale), -7, 7) * scale - part) ** 2).sum())
    return total


@pytest.mark.parametrize("k", [64, 80])
def test_symmetric_int4_is_the_signed_extreme_grid(k: int) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((k, 40)).astype(np.float32)
    w[:, 5] = np.abs(w[:, 5])  # all positive: the extreme is a maximum, the scale < 0
    w[:, 6] = -np.abs(w[:, 6])  # all negative
    w[:16, 7] = 0.0
    w[16:32, 7] = 3.0  # a constant block
    q = quantize_rtn(w, bits=4, block_size=16, symmetric=True)
    ref_codes, ref_scales = _signed_extreme_reference(w, 16)
    np.testing.assert_array_equal(q.scales, ref_scales.astype(np.float32))
    np.testing.assert_array_equal(q.codes.astype(np.int64) - 8, ref_codes)
    # all 16 codes are used, and each block's extreme maps to code 0 and back exactly
    assert q.codes.min() == 0 and q.codes.max() == 15
    deq = q.dequantize()
    for b in range(-(-k // 16)):
        part = w[b * 16 : (b + 1) * 16]
        at = np.argmax(np.abs(part), axis=0)
        cols = np.arange(w.shape[1])
        nonzero = part[at, cols] != 0  # an all-zero block keeps scale 1, code 8
        assert np.all(q.codes[b * 16 + at, cols][nonzero] == 0)
        np.testing.assert_array_equal(deq[b * 16 + at, cols], part[at, cols])
    assert np.all(q.scales[:, 5] < 0) and np.all(q.scales[:, 6] > 0)
    np.testing.assert_array_equal(deq[16:32, 7], 3.0)
    # lower weight error than the 15-level absmax grid (about 20-27% on normal weights)
    new = float(((deq.astype(np.float64) - w) ** 2).sum())
    old = _absmax7_error(w, 16)
    assert new < 0.85 * old


def test_symmetric_int8_keeps_the_absmax_grid() -> None:
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    q = quantize_rtn(w, bits=8, block_size=32, symmetric=True)
    absmax = np.abs(w.reshape(2, 32, 8)).max(axis=1)
    np.testing.assert_allclose(q.scales, absmax / 127, rtol=1e-6)
    assert q.codes.min() >= 1


def test_rtn_blocks_are_independent_along_k() -> None:
    # A huge value in block 0 must not coarsen block 1 of the same column.
    w = np.full((64, 2), 0.01, dtype=np.float32)
    w[0, 0] = 100.0
    q = quantize_rtn(w, bits=4, block_size=32, symmetric=True)
    assert q.scales[0, 0] == pytest.approx(100.0 / -8)
    assert q.scales[1, 0] == pytest.approx(0.01 / -8)
    np.testing.assert_allclose(q.dequantize()[32:, 0], 0.01, rtol=1e-5)
    assert q.dequantize()[0, 0] == 100.0


def test_zero_block_dequantizes_to_zero() -> None:
    w = np.zeros((32, 3), dtype=np.float32)
    for symmetric in (True, False):
        q = quantize_rtn(w, bits=4, block_size=32, symmetric=symmetric)
        assert np.all(np.isfinite(q.scales))
        assert np.all(q.dequantize() == 0.0)


def test_quantize_blocks_and_dequantize_match_rtn() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 5)).astype(np.float32)
    s, z = block_params(w, bits=8, block_size=16, symmetric=False)
    codes = quantize_blocks(w, s, z, bits=8, block_size=16)
    ref = quantize_rtn(w, bits=8, block_size=16, symmetric=False)
    np.testing.assert_array_equal(codes, ref.codes)
    np.testing.assert_array_equal(dequantize_blocks(codes, s, z, 16), ref.dequantize())


@pytest.mark.parametrize("bits", [2, 3, 16, True, "4"])
def test_bad_bits(bits: object) -> None:
    with pytest.raises(ConfigError, match="bits must be 4 or 8"):
        quantize_rtn(np.ones((32, 2)), bits=bits, block_size=32)  # type: ignore[arg-type]


@pytest.mark.parametrize("block_size", [0, 8, 24, 48, -32])
def test_bad_block_size(block_size: int) -> None:
    with pytest.raises(ConfigError, match="power of two >= 16"):
        quantize_rtn(np.ones((32, 2)), bits=4, block_size=block_size)


@pytest.mark.parametrize("shape", [(32,), (2, 3, 4), (0, 4)])
def test_bad_weight_shape(shape: tuple[int, ...]) -> None:
    with pytest.raises(DataError, match=r"2-D \(K, N\)") as info:
        quantize_rtn(np.ones(shape), bits=4, block_size=32)
    assert "transpose" in str(info.value)


def test_non_finite_weight() -> None:
    w = np.ones((32, 2))
    w[3, 1] = np.nan
    with pytest.raises(DataError, match="NaN"):
        quantize_rtn(w)


def test_mismatched_params_shape() -> None:
    w = np.ones((64, 4), dtype=np.float32)
    s, z = block_params(w, bits=4, block_size=32)
    with pytest.raises(DataError, match=r"\(n_blocks, N\)"):
        quantize_blocks(w, s[:1], z[:1], bits=4, block_size=32)
