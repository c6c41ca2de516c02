"""Perplexity, next-token agreement and KL (lpq.weight_only.metrics)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lpq.errors import DataError
from lpq.weight_only import (
    log_softmax,
    mean_kl,
    nll_sum,
    perplexity,
    perplexity_from_nll,
    top1_agreement,
)


def test_perplexity_against_a_hand_computation() -> None:
    logits = np.array([[[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [1.0, 1.0, 1.0]]])
    ids = np.array([[1, 2, 0]])
    # position 0 predicts id 2 under logits (0, 1, 2); position 1 predicts id 0 under (3, 0, 0)
    p1 = math.exp(2) / (1 + math.e + math.exp(2))
    p2 = math.exp(3) / (math.exp(3) + 2)
    expected = math.exp(-(math.log(p1) + math.log(p2)) / 2)
    assert perplexity(logits, ids) == pytest.approx(expected, rel=1e-12)
    total, count = nll_sum(logits, ids)
    assert count == 2 and total == pytest.approx(-(math.log(p1) + math.log(p2)))
    # masking the last target leaves only the first prediction
    assert perplexity(logits, ids, mask=np.array([[1, 1, 0]])) == pytest.approx(1 / p1)


def test_windows_add_up_as_tokens_not_as_perplexities() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 5, 7)), rng.standard_normal((1, 3, 7))
    ia, ib = rng.integers(0, 7, (1, 5)), rng.integers(0, 7, (1, 3))
    (na, ca), (nb, cb) = nll_sum(a, ia), nll_sum(b, ib)
    assert perplexity_from_nll(na + nb, ca + cb) == pytest.approx(math.exp((na + nb) / 6))


def test_uniform_logits_give_the_vocabulary_size() -> None:
    assert perplexity(np.zeros((2, 4, 11)), np.zeros((2, 4), dtype=np.int64)) == pytest.approx(11)


def test_log_softmax_is_stable() -> None:
    z = np.array([1e4, 1e4 - 1.0, -1e4])
    out = log_softmax(z)
    assert np.all(np.isfinite(out))
    assert math.exp(out[0]) == pytest.approx(1 / (1 + math.exp(-1)))


def test_agreement_and_kl() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((2, 6, 9))
    assert top1_agreement(ref, ref) == 1.0
    assert mean_kl(ref, ref) == pytest.approx(0.0, abs=1e-12)
    assert mean_kl(ref, ref + 5.0) == pytest.approx(0.0, abs=1e-12)  # shift invariant
    other = rng.standard_normal((2, 6, 9))
    assert mean_kl(ref, other) > 0
    assert 0.0 <= top1_agreement(ref, other) < 1.0

    p = np.log(np.array([[0.5, 0.5]]))
    q = np.log(np.array([[0.9, 0.1]]))
    assert mean_kl(p, q) == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1))
    a = np.array([[[2.0, 0.0], [0.0, 2.0]]])
    b = np.array([[[2.0, 0.0], [3.0, 0.0]]])
    assert top1_agreement(a, b) == 0.5


def test_bad_inputs() -> None:
    with pytest.raises(DataError, match="token_ids"):
        perplexity(np.zeros((1, 4, 5)), np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(DataError, match=r"\[0, 5\)"):
        perplexity(np.zeros((1, 4, 5)), np.full((1, 4), 5))
    with pytest.raises(DataError, match="at least 2 tokens"):
        perplexity(np.zeros((1, 1, 5)), np.zeros((1, 1), dtype=np.int64))
    with pytest.raises(DataError, match="differ in shape"):
        mean_kl(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(DataError, match="undefined"):
        perplexity_from_nll(0.0, 0)
