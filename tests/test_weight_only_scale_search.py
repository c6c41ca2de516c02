"""Per-block scale/zero-point search (lpq.weight_only.scale_search)."""

from __future__ import annotations

import numpy as np
import pytest

from lpq.errors import ConfigError, DataError
from lpq.weight_only import block_error, pack_matmulnbits, quantize_rtn, search_scales


def _heavy_tailed(k: int = 96, n: int = 40, seed: int = 0) -> np.ndarray:
    """Student-t weights: the outliers that make min/max ranges wasteful."""
    return np.random.default_rng(seed).standard_t(3, size=(k, n)).astype(np.float32)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_search_error_is_at_most_rtn(bits: int, symmetric: bool) -> None:
    w = _heavy_tailed()
    rtn = quantize_rtn(w, bits, 32, symmetric)
    found = search_scales(w, bits, 32, symmetric)
    e_rtn, e_found = block_error(w, rtn), block_error(w, found)
    assert e_found <= e_rtn * (1 + 1e-6)
    if bits == 4:
        # About 6% on these weights either way (the signed-extreme symmetric grid already
        # spends all 16 levels; the former absmax/7 grid left ~16% for the search to gain).
        assert e_found < 0.97 * e_rtn, (e_found, e_rtn)
    assert found.zero_points.dtype == np.uint8
    if symmetric:
        assert np.all(found.zero_points == 2 ** (bits - 1))
    pack_matmulnbits(found)  # integer zero points: packs for MatMulNBits as is


def test_codes_are_consistent_with_scales() -> None:
    w = _heavy_tailed(k=70, seed=1)  # K not a multiple of the block
    found = search_scales(w, 4, 32, False)
    requantized = quantize_rtn(w, 4, 32, False)
    from lpq.weight_only import quantize_blocks

    codes = quantize_blocks(w, found.scales, found.zero_points, 4, 32)
    np.testing.assert_array_equal(codes, found.codes)
    assert found.codes.shape == requantized.codes.shape


def test_importance_steers_the_search() -> None:
    w = _heavy_tailed(seed=2)
    rng = np.random.default_rng(3)
    importance = np.exp(2 * rng.standard_normal(w.shape[0]))
    plain = search_scales(w, 4, 32, False, refine=False)
    weighted = search_scales(w, 4, 32, False, importance=importance, refine=False)
    assert block_error(w, weighted, importance) <= block_error(w, plain, importance)
    assert block_error(w, weighted, importance) < block_error(w, plain, importance) * 0.999


def test_bad_arguments() -> None:
    w = _heavy_tailed()
    with pytest.raises(DataError, match="importance"):
        search_scales(w, importance=np.ones(3))
    with pytest.raises(ConfigError, match="shrink_grid"):
        search_scales(w, shrink_grid=[1.5])
    with pytest.raises(ConfigError, match="bits"):
        search_scales(w, bits=3)
