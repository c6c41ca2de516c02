"""Built-in metrics against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

import lpq
from lpq import F1, MSE, Agreement, CosineSimilarity, TopK


def test_top1_accumulates_over_batches():
    metric = TopK(1)
    metric.update(np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), np.array([1, 1, 1]))
    assert metric.result() == pytest.approx(2 / 3)
    metric.update(np.array([[0.6, 0.4]]), np.array([0]))
    assert metric.result() == pytest.approx(3 / 4)
    metric.reset()
    assert metric.result() == 0.0


def test_topk():
    scores = np.array([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.1, 0.2, 0.7]])
    metric = TopK(2)
    metric.update(scores, np.array([2, 1, 0]))  # out, in (2nd best), out
    assert metric.name == "top2"
    assert metric.result() == pytest.approx(1 / 3)


def test_one_hot_labels_and_multi_output_models():
    metric = TopK(1)
    preds = [np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([[7.0], [7.0]])]  # first output used
    metric.update(preds, np.array([[1, 0], [1, 0]]))
    assert metric.result() == 0.5


def test_agreement_compares_with_reference_outputs():
    metric = Agreement()
    reference = np.array([[0.2, 0.8], [0.6, 0.4], [0.1, 0.9], [0.5, 0.4]])
    quantized = np.array([[0.3, 0.7], [0.4, 0.6], [0.0, 1.0], [0.5, 0.4]])
    metric.update(quantized, reference)
    assert metric.name == "agreement"
    assert metric.result() == pytest.approx(3 / 4)


def test_mse():
    metric = MSE()
    metric.update(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 5.0]))
    assert metric.result() == pytest.approx(4 / 3)
    metric.update(np.array([[0.0]]), np.array([[2.0]]))
    assert metric.result() == pytest.approx(8 / 4)
    assert metric.higher_is_better is False


def test_cosine():
    metric = CosineSimilarity()
    metric.update(
        np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]),
        np.array([[0.0, 1.0], [2.0, 2.0], [0.0, 0.0]]),
    )
    assert metric.result() == pytest.approx((0.0 + 1.0 + 1.0) / 3)  # zero vectors agree


def test_f1_macro():
    metric = F1()
    scores = np.eye(3)[[0, 1, 1, 2]]  # predicts 0, 1, 1, 2
    metric.update(scores, np.array([0, 1, 2, 2]))
    # class 0: 1.0; class 1: tp1 fp1 -> 2/3; class 2: tp1 fn1 -> 2/3
    assert metric.result() == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)


def test_f1_binary_from_single_score_column():
    metric = F1()
    metric.update(np.array([[0.9], [0.2], [0.7], [0.4]]), np.array([1, 1, 0, 0]))
    assert metric.result() == pytest.approx(2 * 1 / (2 * 1 + 1 + 1))  # tp1 fp1 fn1


@pytest.mark.parametrize("metric", [TopK(1), MSE(), CosineSimilarity(), F1()], ids=lambda m: m.name)
def test_missing_labels_are_a_data_error(metric):
    with pytest.raises(lpq.DataError, match="needs labels") as info:
        metric.update(np.zeros((2, 3)), None)
    assert "agreement" in (info.value.hint or "")


def test_label_count_mismatch_is_a_data_error():
    with pytest.raises(
        lpq.DataError, match=r"output has shape \(3, 4\) but the labels have shape \(2,\)"
    ):
        TopK(1).update(np.zeros((3, 4)), np.array([0, 1]))
    with pytest.raises(lpq.DataError, match="predictions have 3 values, targets 2"):
        MSE().update(np.zeros(3), np.zeros(2))
    with pytest.raises(lpq.DataError, match="no outputs"):
        TopK(1).update([], np.array([0]))


def test_metrics_are_registered_through_the_builtin_plugin(lpq_plugin_manager):
    for name in ("top1", "accuracy", "top5", "agreement", "mse", "cosine", "f1"):
        metric = lpq_plugin_manager.create_metric(name)
        assert isinstance(metric, lpq.Metric)
    assert lpq_plugin_manager.create_metric("topk", k=3).name == "top3"
    with pytest.raises(lpq.ConfigError, match="unknown metric 'top0'") as info:
        lpq_plugin_manager.create_metric("top0")
    assert "top1" in (info.value.hint or "")
