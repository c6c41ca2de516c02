"""The ops that compute a model output stay fp32 (lpq_tf.output_heads), and an op that
only moves the float output of an op kept fp32 is not quantized after it.

A detector's score head writes logits for every anchor, most of them far below zero: one
int8 scale for all of them rounds every score near the threshold away (MediaPipe's pose
detector: logits in [-523, 3] written at a step of 2.1, detection F1 at score 0.5 read
0.56; 0.86 with the head in fp32, at the same speed)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.eval.data import ArrayLoader

tf = pytest.importorskip("tensorflow")

from tf_testmodels import head_images, quantized_and_reference  # noqa: E402

from lpq_tf import graph  # noqa: E402
from lpq_tf.model_io import prepare  # noqa: E402


def anchor_scores() -> Any:
    """(8, 8, 3) image -> conv backbone -> 1x1 conv score head of two anchors per place ->
    (128, 1) logits: the first anchor's within a few units of zero, the second's far below
    (a background anchor), all in one output as a detector writes them."""
    image = tf.keras.Input((8, 8, 3), name="image")
    features = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="body")(image)
    logits = tf.keras.layers.Conv2D(2, 1, name="score")(features)
    flat = tf.keras.layers.Reshape((128, 1), name="flatten")(logits)
    model = tf.keras.Model(image, flat)
    rng = np.random.default_rng(0)
    model.get_layer("body").set_weights(
        [rng.normal(0, 0.5, (3, 3, 3, 8)).astype(np.float32), np.zeros(8, np.float32)]
    )
    weight = np.zeros((1, 1, 8, 2), np.float32)
    weight[0, 0, :, 0] = rng.normal(0, 1.0, 8)
    model.get_layer("score").set_weights([weight, np.array([0.0, -500.0], np.float32)])
    return model


def quantize(model: Any, **options: Any) -> Any:
    return lpq.quantize(
        model,
        lpq.PostTrainingQuantConfig(
            approach="static", latency_aware=False, adaptor_options=options
        ),
        ArrayLoader(head_images(16, seed=1), batch_size=1),
    )


def near_zero_error(model: Any, result: Any) -> float:
    """The largest logit error, over held-out images, on logits within 4 of zero (where a
    0.5 score threshold decides)."""
    got, ref = quantized_and_reference(model, result)
    near = np.abs(ref) < 4
    assert near.sum() >= 8  # the model has logits there to judge
    return float(np.abs(got - ref)[near].max())


def test_the_op_computing_an_output_stays_fp32_and_its_logits_survive(caplog):
    model = anchor_scores()
    with caplog.at_level(logging.INFO, logger="lpq.tf"):
        result = quantize(model)
    said = [r.getMessage() for r in caplog.records if "kept fp32" in r.getMessage()]
    assert any("compute model output" in line and "score" in line for line in said)
    # Read from the converted model: the head in float, the backbone in int8.
    ops = lpq.get_plugin_manager().quantized_ops(result.framework, result.model)
    assert ops["score"] == "fp32" and ops["body"] == "int8"
    assert not result.model.tune_cfg.ops[("score", "CONV_2D")].quantized
    assert near_zero_error(model, result) < 0.5


def test_turned_off_the_head_is_int8_and_its_logits_are_rounded_away():
    model = anchor_scores()
    result = quantize(model, float_output_ops=False)
    ops = lpq.get_plugin_manager().quantized_ops(result.framework, result.model)
    assert ops["score"] == "int8"
    assert near_zero_error(model, result) > 1.0


def test_a_model_whose_only_quantized_op_computes_its_output_stays_quantized():
    x = tf.keras.Input((8,), name="x")
    model = tf.keras.Model(x, tf.keras.layers.Dense(4, name="fc")(x))
    result = lpq.quantize(
        model,
        lpq.PostTrainingQuantConfig(approach="static", latency_aware=False),
        ArrayLoader(np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32), batch_size=1),
    )
    assert lpq.get_plugin_manager().quantized_ops(result.framework, result.model)["fc"] == "int8"


def test_a_reshape_after_an_op_kept_fp32_is_not_quantized(tmp_path: Path):
    """ai-edge-quantizer route (a .tflite input): the base recipe entry quantized every
    op lpq did not name, so a RESHAPE after a conv kept fp32 got a QUANTIZE and the
    CONCATENATION after it ran int8 although the recipe kept it fp32."""
    image = tf.keras.Input((8, 8, 3), name="image")
    body = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="body")(image)
    heads = [
        tf.keras.layers.Reshape((64, 1), name=f"flat{k}")(
            tf.keras.layers.Conv2D(1, 1, name=f"head{k}")(body)
        )
        for k in range(2)
    ]
    joined = tf.keras.layers.Concatenate(axis=1, name="joined")(heads)
    path = tmp_path / "heads.tflite"
    path.write_bytes(prepare(tf.keras.Model(image, joined)).float_tflite)
    ops = prepare(str(path)).ops()  # a .tflite's op names are its tensors'
    kept = [name for name, op_type, _ in ops if op_type == "CONCATENATION" or "head" in name]
    assert len(kept) == 3
    conf = lpq.PostTrainingQuantConfig(
        approach="static",
        latency_aware=False,
        adaptor_options={"float_output_ops": False},
        op_name_dict={re.escape(name): "fp32" for name in kept},
    )
    result = lpq.quantize(str(path), conf, ArrayLoader(head_images(16, seed=1), batch_size=1))
    parsed = graph.read(result.model.content)
    types = {op.op_type: op for op in parsed.ops}
    assert "QUANTIZE" in types  # the body is int8
    for op_type in ("RESHAPE", "CONCATENATION"):
        tensor = parsed.tensors[types[op_type].outputs[0]]
        assert np.dtype(tensor.dtype) == np.float32, (op_type, tensor.name)


def test_the_returned_tune_cfg_is_the_model_and_quantizes_to_it_again():
    """lpq.quantize returns lpq-tf's resolved configuration (lpq_resolved_config): the
    head as the fallback it is, and the same model from it again."""
    model = anchor_scores()
    result = quantize(model)
    assert not result.tune_cfg.ops[("score", "CONV_2D")].quantized
    again = lpq.quantize(
        model, None, ArrayLoader(head_images(16, seed=1), batch_size=1), tune_cfg=result.tune_cfg
    )
    assert again.model.content == result.model.content
