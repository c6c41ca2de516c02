"""AWQ scale search (lpq.weight_only.awq)."""

from __future__ import annotations

import numpy as np
import pytest

from lpq.errors import ConfigError, DataError
from lpq.weight_only import apply_awq_scales, awq_scales, awq_search, quantize_rtn

K, N, M = 128, 32, 256


def _outlier_inputs(seed: int = 0) -> np.ndarray:
    """Activations where a few input channels are ~30x larger than the rest (as in LLMs)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K))
    x[:, [3, 50, 99]] *= 30.0
    return x.astype(np.float32)


def _weight(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((K, N)).astype(np.float32)


def _error(x: np.ndarray, w: np.ndarray, x_eff: np.ndarray, w_eff: np.ndarray) -> float:
    ref = x.astype(np.float64) @ w.astype(np.float64)
    return float(np.mean((x_eff.astype(np.float64) @ w_eff.astype(np.float64) - ref) ** 2))


@pytest.mark.parametrize("symmetric", [True, False])
def test_chosen_alpha_is_no_worse_than_rtn_and_helps_on_outliers(symmetric: bool) -> None:
    x, w = _outlier_inputs(), _weight()
    result = awq_search(w, x, bits=4, block_size=32, symmetric=symmetric, n_grid=10)
    assert result.alphas[0] == 0.0 and result.alphas[-1] == 1.0 and len(result.errors) == 11
    rtn_error = _error(x, w, x, quantize_rtn(w, 4, 32, symmetric).dequantize())
    assert result.errors[0] == pytest.approx(rtn_error, rel=1e-6)
    chosen = _error(x, w, x / result.scales, result.quantized.dequantize())
    assert chosen == pytest.approx(result.errors.min(), rel=1e-6)
    assert chosen <= rtn_error
    assert result.alpha > 0.0 and chosen < 0.8 * rtn_error, (result.alpha, chosen, rtn_error)


def test_scales_preserve_float_outputs_before_rounding() -> None:
    x, w = _outlier_inputs(2), _weight(3)
    s = awq_scales(np.mean(np.abs(x), axis=0), 0.5)
    assert s.shape == (K,) and np.all(s > 0)
    assert s.max() * s.min() == pytest.approx(1.0, rel=1e-5)
    assert s[3] > 5 * np.median(s)  # outlier channels get the largest scales
    w_s, x_s = apply_awq_scales(w, x, s)
    np.testing.assert_allclose(x_s @ w_s, x @ w, rtol=1e-4, atol=1e-3)
    # ...while the scaled weight really differs (the check above is not vacuous).
    assert np.max(np.abs(w_s - w)) > 1.0


def test_alpha_zero_is_identity_and_dead_channels_get_finite_scales() -> None:
    np.testing.assert_array_equal(awq_scales(np.array([0.5, 2.0, 7.0]), 0.0), 1.0)
    s = awq_scales(np.array([0.0, 1.0, 4.0]), 1.0)
    assert np.all(np.isfinite(s)) and s[0] == s.min()
    np.testing.assert_array_equal(awq_scales(np.zeros(4), 0.7), 1.0)


def test_bad_inputs() -> None:
    w = _weight()
    with pytest.raises(DataError, match="K=128"):
        awq_search(w, np.ones((10, K + 1)))
    with pytest.raises(ConfigError, match="n_grid"):
        awq_search(w, np.ones((10, K)), n_grid=0)
    bad = np.ones((10, K))
    bad[0, 0] = np.inf
    with pytest.raises(DataError, match="NaN or infinity"):
        awq_search(w, bad)
