"""The shared-scale rule in lpq-mxnet: a Gluon head that concatenates pixel boxes and
sigmoid scores keeps its Concat fp32, and the scores survive int8; turned off, MXNet's one
int8 range rounds them away. The rule itself is core's (tests/test_ranges_shared_scale.py)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.eval.data import ArrayLoader, OutputRecorder

mx = pytest.importorskip("mxnet")


def yolo_head(box_scale: float) -> Any:
    """(3, 8, 8) image -> 1x1 conv -> (5, 64): boxes (sigmoid x ``box_scale``) and one
    class score (sigmoid), concatenated as a detector's export does."""

    class Head(mx.gluon.nn.HybridBlock):
        def __init__(self) -> None:
            super().__init__(prefix="head_")
            with self.name_scope():
                self.conv = mx.gluon.nn.Conv2D(5, 1, in_channels=3)

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            raw = self.conv(x).reshape((0, 5, -1))
            boxes = F.sigmoid(F.slice_axis(raw, axis=1, begin=0, end=4)) * box_scale
            scores = F.sigmoid(F.slice_axis(raw, axis=1, begin=4, end=5))
            return F.concat(boxes, scores, dim=1)

    mx.random.seed(0)
    net = Head()
    net.initialize(mx.init.Normal(1.0))
    net.hybridize()
    return net


def images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (count, 3, 8, 8)).astype(np.float32)


def quantized_score_error(net: Any, **options: Any) -> tuple[float, Any]:
    """The largest class-score difference from the fp32 block's over held-out images,
    and the quantized model."""
    held_out = images(8, seed=2)
    reference = net(mx.nd.array(held_out)).asnumpy()
    result = lpq.quantize(
        net,
        lpq.PostTrainingQuantConfig(
            approach="static", latency_aware=False, adaptor_options=options
        ),
        ArrayLoader(images(16, seed=1), batch_size=4),
    )
    recorder = OutputRecorder()
    lpq.get_plugin_manager().evaluate(
        result.framework, result.model, ArrayLoader(held_out, batch_size=4), [recorder]
    )
    got = np.concatenate([out[0] if isinstance(out, list) else out for out in recorder.outputs])
    return float(np.abs(got[:, 4] - reference[:, 4]).max()), result


def concat_precision(result: Any) -> str:
    """The Concat's precision, read from the quantized block."""
    ops = lpq.get_plugin_manager().quantized_ops(result.framework, result.model)
    (name,) = [name for name in ops if "concat" in name]
    return ops[name]


def test_a_head_concat_of_pixels_and_probabilities_stays_fp32(caplog):
    with caplog.at_level(logging.INFO, logger="lpq.mxnet"):
        error, result = quantized_score_error(yolo_head(320.0))
    assert any("kept fp32: head_concat0" in r.getMessage() for r in caplog.records)
    assert concat_precision(result) == "fp32"
    assert error < 0.05


def test_turned_off_the_one_range_rounds_the_scores_away():
    error, result = quantized_score_error(yolo_head(320.0), concat_max_spread=0)
    assert concat_precision(result) == "int8"
    assert error > 0.3  # one step of a [0, 320] int8 range is 1.25


def test_a_concat_of_alike_ranges_is_quantized():
    error, result = quantized_score_error(yolo_head(2.0))
    assert concat_precision(result) == "int8"
    assert error < 0.05
