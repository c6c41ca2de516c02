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
    step = np.repeat(q.scales, 32, axis=0)[:k]
    err = np.abs(q.dequantize() - w)
    assert np.all(err <= 0.5 * step * (1 + 1e-5) + 1e-7)
    if symmetric:
        assert np.all(q.zero_points == 2 ** (bits - 1))


def test_rtn_blocks_are_independent_along_k() -> None:
    # A huge value in block 0 must not coarsen block 1 of the same column.
    w = np.full((64, 2), 0.01, dtype=np.float32)
    w[0, 0] = 100.0
    q = quantize_rtn(w, bits=4, block_size=32, symmetric=True)
    assert q.scales[0, 0] == pytest.approx(100.0 / 7)
    assert q.scales[1, 0] == pytest.approx(0.01 / 7)
    np.testing.assert_allclose(q.dequantize()[32:, 0], 0.01, rtol=1e-5)


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
