"""GPTQ (lpq.weight_only.gptq) against RTN on correlated inputs."""

from __future__ import annotations

import numpy as np
import pytest

from lpq.errors import ConfigError, DataError
from lpq.weight_only import HessianAccumulator, gptq_quantize, quantize_rtn

K, N, M = 96, 24, 512


def _correlated_inputs(seed: int = 0) -> np.ndarray:
    """Activations with a strong rank-4 correlation and uneven channel magnitudes."""
    rng = np.random.default_rng(seed)
    low_rank = rng.standard_normal((M, 4)) @ rng.standard_normal((4, K))
    x = low_rank + 0.1 * rng.standard_normal((M, K))
    return x * np.exp(rng.standard_normal(K))


def _weight(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((K, N)).astype(np.float32)


def _output_error(x: np.ndarray, w: np.ndarray, wq: np.ndarray) -> float:
    return float(np.mean((x @ w - x @ wq) ** 2))


def _hessian(x: np.ndarray) -> np.ndarray:
    acc = HessianAccumulator(x.shape[1])
    for batch in np.array_split(x, 5):
        acc.add(batch)
    return acc.hessian


def test_accumulator_matches_one_shot_hessian() -> None:
    x = _correlated_inputs()
    np.testing.assert_allclose(_hessian(x), 2.0 / M * x.T @ x, rtol=1e-10, atol=1e-8)


def test_accumulator_accepts_sequence_batches_and_checks_k() -> None:
    acc = HessianAccumulator(8)
    acc.add(np.ones((2, 3, 8)))
    assert acc.n_samples == 6
    np.testing.assert_allclose(acc.hessian, 2.0 * np.ones((8, 8)))
    with pytest.raises(DataError, match="K=8"):
        acc.add(np.ones((4, 7)))
    with pytest.raises(DataError, match="no activations"):
        _ = HessianAccumulator(8).hessian
    with pytest.raises(ConfigError, match="positive input size"):
        HessianAccumulator(0)


@pytest.mark.parametrize("symmetric", [True, False])
def test_gptq_beats_rtn_on_correlated_inputs(symmetric: bool) -> None:
    x, w = _correlated_inputs(), _weight()
    rtn = quantize_rtn(w, bits=4, block_size=32, symmetric=symmetric)
    result = gptq_quantize(w, _hessian(x), bits=4, block_size=32, symmetric=symmetric)
    q = result.quantized
    assert q.codes.shape == (K, N) and q.scales.shape == (3, N) and result.perm is None
    assert q.codes.max() <= 15
    e_rtn = _output_error(x, w, rtn.dequantize())
    e_gptq = _output_error(x, w, q.dequantize())
    assert e_gptq < 0.2 * e_rtn, (e_gptq, e_rtn)


def test_act_order_does_not_hurt() -> None:
    x, w = _correlated_inputs(2), _weight(3)
    h = _hessian(x)
    plain = gptq_quantize(w, h, bits=4, block_size=32, symmetric=False)
    ordered = gptq_quantize(w, h, bits=4, block_size=32, symmetric=False, act_order=True)
    assert ordered.perm is not None
    np.testing.assert_array_equal(np.sort(ordered.perm), np.arange(K))
    e_plain = _output_error(x, w, plain.quantized.dequantize())
    e_ordered = _output_error(x, w, ordered.quantized.dequantize())
    assert e_ordered <= 1.05 * e_plain, (e_ordered, e_plain)
    # Act-order keeps groups contiguous along K: its scales are the original blocks' RTN ones.
    rtn = quantize_rtn(w, bits=4, block_size=32, symmetric=False)
    np.testing.assert_array_equal(ordered.quantized.scales, rtn.scales)
    np.testing.assert_array_equal(ordered.quantized.zero_points, rtn.zero_points)


def test_identity_hessian_reduces_to_rtn() -> None:
    # Uncorrelated unit inputs: no error feedback, so GPTQ must be exactly RTN.
    w = _weight(4)
    for symmetric in (True, False):
        q = gptq_quantize(w, np.eye(K), bits=4, block_size=32, symmetric=symmetric).quantized
        rtn = quantize_rtn(w, bits=4, block_size=32, symmetric=symmetric)
        np.testing.assert_array_equal(q.codes, rtn.codes)
        np.testing.assert_array_equal(q.scales, rtn.scales)


@pytest.mark.parametrize("act_order", [False, True])
def test_dead_inputs_are_kept_and_rounded(act_order: bool) -> None:
    x, w = _correlated_inputs(5), _weight(6)
    dead = [0, 40, 95]
    x[:, dead] = 0.0
    result = gptq_quantize(w, _hessian(x), bits=8, block_size=32, act_order=act_order)
    deq = result.quantized.dequantize()
    assert np.all(np.isfinite(deq))
    step = np.repeat(result.quantized.scales, 32, axis=0)[:K]
    err = np.abs(deq[dead] - w[dead])
    assert np.all(err <= 0.5 * step[dead] * (1 + 1e-5))


def test_k_not_a_multiple_of_the_block() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((200, 40)) @ rng.standard_normal((40, 40))
    w = rng.standard_normal((40, 8)).astype(np.float32)
    acc = HessianAccumulator(40)
    acc.add(x)
    q = gptq_quantize(w, acc.hessian, bits=4, block_size=16, symmetric=False).quantized
    assert q.scales.shape == (3, 8)
    rtn = quantize_rtn(w, bits=4, block_size=16, symmetric=False)
    assert _output_error(x, w, q.dequantize()) < _output_error(x, w, rtn.dequantize())


def test_bad_inputs() -> None:
    w = _weight()
    with pytest.raises(DataError, match=r"\(K, K\)"):
        gptq_quantize(w, np.eye(K - 1))
    with pytest.raises(ConfigError, match="damp_percent"):
        gptq_quantize(w, np.eye(K), damp_percent=-1)
    with pytest.raises(DataError, match="positive definite") as info:
        gptq_quantize(w, -np.ones((K, K)) + np.eye(K) * 2, damp_percent=0.0)
    assert "damp_percent" in str(info.value)


def test_lazy_batch_updates_give_the_same_result() -> None:
    # Pushing the error every 32 inputs or once at the end is the same algebra.
    x, w = _correlated_inputs(8), _weight(9)
    h = _hessian(x)
    one = gptq_quantize(w, h, bits=4, block_size=32, update_block=128).quantized
    three = gptq_quantize(w, h, bits=4, block_size=32, update_block=32).quantized
    np.testing.assert_array_equal(three.codes, one.codes)
    np.testing.assert_allclose(three.scales, one.scales, rtol=1e-6)


def _sink_inputs() -> np.ndarray:
    """(16 sequences, 32 positions, K=64): correlated tokens, and at position 0 a small,
    atypical "attention sink" row (a decoder's first token)."""
    rng = np.random.default_rng(0)
    k = 64
    basis = rng.standard_normal((k, k))
    x = rng.standard_normal((16, 32, k)) @ (basis * np.geomspace(1, 0.02, k)[:, None])
    x[:, 0] = 0.5 * rng.standard_normal(k) + 0.01 * rng.standard_normal((16, k))
    return x


def test_accumulator_weights_first_token_of_each_sequence() -> None:
    x = _sink_inputs()
    acc = HessianAccumulator(64)
    acc.add(x[:5], first_token_weight=32)
    acc.add(x[5:], first_token_weight=32)
    rows = np.ones((16, 32))
    rows[:, 0] = 32
    flat = x.reshape(-1, 64)
    expected = 2 * (flat * rows.reshape(-1, 1)).T @ flat / rows.sum()
    np.testing.assert_allclose(acc.hessian, expected, rtol=1e-10, atol=1e-10)
    assert acc.n_samples == 16 * 32
    flat_acc = HessianAccumulator(64)
    flat_acc.add(flat, first_token_weight=32)  # 2-D: plain rows
    np.testing.assert_allclose(flat_acc.hessian, 2 * flat.T @ flat / len(flat), rtol=1e-10)
    with pytest.raises(ConfigError, match="first_token_weight"):
        acc.add(x, first_token_weight=0)


def test_gptq_keeps_the_first_token_when_weighted() -> None:
    # with equal weights GPTQ pushes error into the sink row's direction (worse than
    # RTN there: on SmolLM2 that cost more perplexity than GPTQ saved elsewhere)
    x = _sink_inputs()
    w = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    rtn = quantize_rtn(w, bits=4, block_size=32).dequantize()
    rest = x[:, 1:].reshape(-1, 64)
    errors = {}
    for weight in (1.0, 32.0):
        acc = HessianAccumulator(64)
        acc.add(x, first_token_weight=weight)
        q = gptq_quantize(w, acc.hessian, bits=4, block_size=32).quantized.dequantize()
        errors[weight] = (_output_error(x[:, 0], w, q), _output_error(rest, w, q))
    sink_rtn = _output_error(x[:, 0], w, rtn)
    rest_rtn = _output_error(rest, w, rtn)
    assert errors[1.0][0] > sink_rtn  # the defect the weighting fixes
    assert errors[32.0][0] < 0.3 * errors[1.0][0]
    assert errors[32.0][0] < 0.5 * sink_rtn
    assert errors[32.0][1] < 1.1 * errors[1.0][1]  # the other tokens barely pay for it
    assert errors[32.0][1] < 0.5 * rest_rtn
