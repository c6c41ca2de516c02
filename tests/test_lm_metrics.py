"""The built-in language-model metrics: perplexity against a hand computation, next-token
agreement against the fp32 logits, and clear errors for the wrong kind of labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lpq
from lpq.eval.lm_metrics import Perplexity, TokenAgreement, TokenKL


def test_perplexity_matches_a_hand_computation_over_two_batches():
    logits = np.log(np.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]]))
    ids = np.array([[1, 0, 2]])  # position t predicts token t+1: p = 0.5, then 0.1
    metric = Perplexity()
    metric.update(logits, ids)
    metric.update(logits, ids)
    assert metric.result() == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.1)) / 2))


def test_token_agreement_counts_matching_top_tokens():
    ref = np.zeros((1, 4, 5), np.float32)
    ref[0, np.arange(4), [0, 1, 2, 3]] = 1.0
    cand = ref.copy()
    cand[0, 3] = np.roll(cand[0, 3], 1)
    metric = TokenAgreement()
    metric.update(cand, ref)
    assert metric.result() == pytest.approx(0.75)


def test_perplexity_refuses_reference_logits_as_labels():
    with pytest.raises(lpq.DataError, match="token ids as labels"):
        Perplexity().update(np.zeros((1, 2, 3)), np.zeros((1, 2, 3), np.float32))


def test_both_are_registered_by_lpq_core():
    pm = lpq.get_plugin_manager()
    pm.load()
    assert pm.metrics.owner("perplexity") == pm.metrics.owner("token_agreement") == "lpq-builtin"
    assert pm.metrics.owner("token_kl") == "lpq-builtin"


def test_token_kl_matches_a_hand_computation_weighted_by_positions():
    p = np.array([0.7, 0.2, 0.1])
    q = np.array([0.5, 0.3, 0.2])
    ref = np.log(np.stack([p, p]))[None]  # one window of 2 positions
    cand = np.log(np.stack([q, p]))[None]  # the second position is exact
    metric = TokenKL()
    metric.update(cand, ref)
    metric.update(np.log(p)[None, None], np.log(p)[None, None])  # one more, exact
    kl = float(np.sum(p * np.log(p / q)))
    assert metric.result() == pytest.approx(kl / 3)
    assert TokenKL.higher_is_better is False


def test_token_kl_sees_what_top1_agreement_cannot():
    ref = np.log(np.array([[[0.9, 0.05, 0.05]]]))
    flat = np.log(np.array([[[0.4, 0.3, 0.3]]]))  # same argmax, another distribution
    agreement, kl = TokenAgreement(), TokenKL()
    agreement.update(flat, ref)
    kl.update(flat, ref)
    assert agreement.result() == 1.0 and kl.result() > 0.3
