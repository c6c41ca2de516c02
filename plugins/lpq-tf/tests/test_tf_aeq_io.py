"""The ai-edge-quantizer route (float ``.tflite`` inputs): its outputs stay float32 unless
``io_dtype`` is int8, and its activation ranges cover every value calibration saw.

Both were wrong before: ai-edge-quantizer quantized graph outputs whatever the recipe said
(MediaPipe's BlazeFace gave int8 face logits at a step of 1.4), and its calibration kept a
moving average of each sample's min and max, which cut off the face logits only a few
pictures reach (no face above 0.5 in the int8 model; 0.917 detection F1 at 0.5 after)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.eval.data import ArrayLoader

tf = pytest.importorskip("tensorflow")

from ai_edge_litert.interpreter import Interpreter  # noqa: E402

from lpq_tf import graph  # noqa: E402
from lpq_tf.calibration import collect  # noqa: E402
from lpq_tf.calibration.calibrated import aeq_calibration  # noqa: E402
from lpq_tf.model_io import prepare  # noqa: E402
from lpq_tf.runtime import Runner  # noqa: E402


def two_heads(path: Path) -> Path:
    x = tf.keras.Input((8,), name="x")
    hidden = tf.keras.layers.Dense(16, activation="relu", name="fc1")(x)
    boxes = tf.keras.layers.Dense(4, name="boxes")(hidden)
    scores = tf.keras.layers.Dense(1, name="scores")(hidden)
    joined = tf.keras.layers.Concatenate(name="cat")([boxes, scores])
    path.write_bytes(prepare(tf.keras.Model(x, [joined, boxes])).float_tflite)
    return path


def samples(count: int = 16) -> np.ndarray:
    data = np.random.default_rng(0).normal(size=(count, 8)).astype(np.float32)
    data[3] *= 20.0  # one sample far out: a range must still cover it
    return data


def quantized(path: Path, **options: Any) -> Any:
    conf = lpq.PostTrainingQuantConfig(
        approach="static", latency_aware=False, adaptor_options=options
    )
    return lpq.quantize(str(path), conf, ArrayLoader(samples(), batch_size=1))


def test_outputs_stay_float_and_keep_their_names(tmp_path: Path):
    path = two_heads(tmp_path / "heads.tflite")
    result = quantized(path)
    details = Interpreter(model_content=result.model.content).get_output_details()
    assert [d["dtype"] for d in details] == [np.float32, np.float32]
    pm = lpq.get_plugin_manager()
    assert pm.output_names("tf", result.model) == pm.output_names("tf", str(path))
    data = samples()
    quantized_runner, float_runner = Runner(result.model.content), Runner(path.read_bytes())
    got = [quantized_runner.run([data[i : i + 1]]) for i in range(len(data))]
    ref = [float_runner.run([data[i : i + 1]]) for i in range(len(data))]
    for k in range(2):  # within a few int8 steps of each output's calibrated range
        g = np.concatenate([out[k] for out in got])
        r = np.concatenate([out[k] for out in ref])
        assert np.abs(g - r).max() < 0.05 * (r.max() - r.min())
    # Asked for integer I/O, the outputs are int8.
    integer = quantized(path, io_dtype="int8")
    details = Interpreter(model_content=integer.model.content).get_output_details()
    assert {d["dtype"] for d in details} == {np.int8}


def test_calibrated_ranges_cover_every_value_seen(tmp_path: Path):
    prepared = prepare(two_heads(tmp_path / "heads.tflite"))
    data = samples()
    ranges = aeq_calibration(prepared, collect(prepared.float_tflite, ArrayLoader(data), 100))
    runner = Runner(prepared.float_tflite)
    outputs = [runner.run([data[i : i + 1]]) for i in range(len(data))]
    parsed = graph.read(prepared.float_tflite)
    for k, tensor in enumerate(parsed.outputs):
        values = np.concatenate([out[k] for out in outputs])
        seen = ranges[parsed.tensors[tensor].name]
        assert float(np.min(seen["min"])) == pytest.approx(float(values.min()), rel=1e-5)
        assert float(np.max(seen["max"])) == pytest.approx(float(values.max()), rel=1e-5)
