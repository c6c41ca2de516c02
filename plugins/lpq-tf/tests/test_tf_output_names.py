"""``lpq_output_names`` for TensorFlow models: the serving signature's names, in the order
evaluation passes the outputs to metrics, for the float model and the quantized one."""

from __future__ import annotations

import numpy as np
import pytest

import lpq
from lpq.eval.data import ArrayLoader, OutputRecorder

tf = pytest.importorskip("tensorflow")


def two_outputs() -> tf.keras.Model:
    x = tf.keras.Input((8,), name="x")
    hidden = tf.keras.layers.Dense(16, activation="relu", name="trunk")(x)
    boxes = tf.keras.layers.Dense(6, name="boxes")(hidden)
    scores = tf.keras.layers.Dense(2, activation="sigmoid", name="scores")(hidden)
    return tf.keras.Model(x, {"boxes": boxes, "scores": scores})


def test_output_names_follow_the_signature_and_the_evaluated_order():
    pm = lpq.get_plugin_manager()
    model = two_outputs()
    data = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
    quantized = lpq.quantize(
        model,
        lpq.PostTrainingQuantConfig(approach="static", latency_aware=False),
        ArrayLoader(data, batch_size=1),
    ).model
    assert "int8" in pm.quantized_ops("tf", quantized).values()
    widths = {"boxes": 6, "scores": 2}
    for each in (model, quantized):
        names = pm.output_names("tf", each)
        assert sorted(names) == ["boxes", "scores"]
        recorder = OutputRecorder()
        pm.evaluate("tf", each, ArrayLoader(data[:2], batch_size=2), [recorder])
        outputs = recorder.outputs[0]
        assert [o.shape[-1] for o in outputs] == [widths[n] for n in names]
