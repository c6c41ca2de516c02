"""The shared-scale rule in lpq-tf: a Keras detector head that concatenates pixel boxes
and sigmoid scores keeps its CONCATENATION fp32, and the scores survive int8; turned off,
TFLite's one int8 scale rounds them away. The rule itself is core's
(tests/test_ranges_shared_scale.py)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.eval.data import ArrayLoader

tf = pytest.importorskip("tensorflow")

from tf_testmodels import head_images, quantized_and_reference  # noqa: E402


def yolo_head(box_scale: float) -> Any:
    """(8, 8, 3) image -> 1x1 conv -> (64, 5): boxes (sigmoid x ``box_scale``) and one
    class score (sigmoid), concatenated as a detector's export does."""
    image = tf.keras.Input((8, 8, 3), name="image")
    raw = tf.keras.layers.Conv2D(5, 1, name="head")(image)
    flat = tf.keras.layers.Reshape((64, 5), name="flatten")(raw)
    boxes = tf.keras.layers.Lambda(lambda t: tf.sigmoid(t[..., :4]) * box_scale, name="boxes")(flat)
    scores = tf.keras.layers.Lambda(lambda t: tf.sigmoid(t[..., 4:]), name="scores")(flat)
    output = tf.keras.layers.Concatenate(axis=-1, name="concat")([boxes, scores])
    model = tf.keras.Model(image, output)
    rng = np.random.default_rng(0)
    model.get_layer("head").set_weights(
        [
            rng.normal(0, 1.5, (1, 1, 3, 5)).astype(np.float32),
            rng.normal(0, 0.5, 5).astype(np.float32),
        ]
    )
    return model


def quantized_score_error(model: Any, **options: Any) -> tuple[float, Any]:
    """The largest class-score difference from the Keras model's over held-out images,
    and the quantized model. The output-head rule (test_tf_output_heads.py) is off: the
    head's concatenation writes the model output, and that rule alone would keep it fp32."""
    result = lpq.quantize(
        model,
        lpq.PostTrainingQuantConfig(
            approach="static",
            latency_aware=False,
            adaptor_options={"float_output_ops": False, **options},
        ),
        ArrayLoader(head_images(16, seed=1), batch_size=1),
    )
    got, ref = quantized_and_reference(model, result)
    return float(np.abs(got[..., 4] - ref[..., 4]).max()), result


def concat_quantized(result: Any) -> bool:
    """Whether the tune_cfg lpq-tf's model records (the configuration it really is)
    quantizes the concatenation."""
    return bool(result.model.tune_cfg.ops[("concat", "CONCATENATION")].quantized)


def test_a_head_concatenation_of_pixels_and_probabilities_stays_fp32(caplog):
    with caplog.at_level(logging.INFO, logger="lpq.tf"):
        error, result = quantized_score_error(yolo_head(320.0))
    assert any("kept fp32: concat" in r.getMessage() for r in caplog.records)
    assert not concat_quantized(result)
    # Read from the converted model: the concatenation runs in float, the conv in int8.
    ops = lpq.get_plugin_manager().quantized_ops(result.framework, result.model)
    assert ops["concat"] == "fp32" and ops["head"] == "int8"
    assert error < 0.05


def test_turned_off_tflites_one_scale_rounds_the_scores_away():
    error, result = quantized_score_error(yolo_head(320.0), concat_max_spread=0)
    assert concat_quantized(result)
    assert error > 0.3  # one step of a [0, 320] int8 range is 1.25


def test_a_concatenation_of_alike_ranges_is_quantized():
    error, result = quantized_score_error(yolo_head(2.0))
    assert concat_quantized(result)
    assert error < 0.05
