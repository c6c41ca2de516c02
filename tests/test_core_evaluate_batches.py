"""The evaluation loop adaptors share: lpq.evaluate_batches."""

from __future__ import annotations

import numpy as np
import pytest

import lpq
from lpq import TopK


def batches(n: int):
    for i in range(n):
        x = np.eye(4, dtype=np.float32)[[i % 4, (i + 1) % 4]]
        yield x, x.argmax(axis=1)


def test_scores_counts_and_limits_iterations():
    calls = []

    def run(inputs):
        calls.append(len(inputs))
        return inputs * 2

    result = lpq.evaluate_batches(batches(5), run, [TopK(1)], iteration=3)
    assert calls == [2, 2, 2]
    assert result.batches == 3 and result.samples == 6
    assert result.metrics == {"top1": 1.0}
    assert result.latency_ms is None


def test_measurer_times_only_the_framework_call():
    measurer = lpq.LatencyMeasurer(warmup=0)
    converted = []

    def to_numpy(outputs):
        converted.append(outputs)
        return outputs

    lpq.evaluate_batches(batches(4), lambda x: x, [TopK(1)], measurer=measurer, to_numpy=to_numpy)
    assert len(measurer.samples) == 4 and len(converted) == 4


def test_postprocess_sees_predictions_and_labels():
    flip = lambda preds, labels: (preds[:, ::-1], labels)  # noqa: E731
    result = lpq.evaluate_batches(batches(2), lambda x: x, [TopK(1)], postprocess=flip)
    assert result.metrics["top1"] == 0.0


def test_empty_data_is_a_data_error():
    with pytest.raises(lpq.DataError, match="no batches"):
        lpq.evaluate_batches(iter([]), lambda x: x, [TopK(1)])
