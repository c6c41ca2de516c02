"""An op LiteRT has no kernel for as quantized stays fp32, said, and the model is written
(a user would do the same; MediaPipe's pose detector had 20 such convs before lpq-tf made
its sparse weights constants). Made here with a conv whose filter is a model input:
ai-edge-quantizer quantizes it as an activation (a zero point), which LiteRT's int8 conv
refuses."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import lpq
from lpq.eval.data import ArrayLoader

tf = pytest.importorskip("tensorflow")

from lpq_tf.model_io import prepare  # noqa: E402
from lpq_tf.quantize import no_kernel  # noqa: E402


def conv_with_a_filter_input(path: Path) -> Path:
    image = tf.keras.Input((8, 8, 3), name="image")
    filters = tf.keras.Input((1, 1, 3, 4), batch_size=1, name="filters")
    out = tf.keras.layers.Lambda(lambda t: tf.nn.conv2d(t[0], t[1][0], 1, "SAME"), name="dyn")(
        [image, filters]
    )
    path.write_bytes(prepare(tf.keras.Model([image, filters], out)).float_tflite)
    return path


def test_an_op_without_an_int8_kernel_stays_fp32_and_the_model_runs(tmp_path: Path, caplog):
    path = conv_with_a_filter_input(tmp_path / "dynamic_filter.tflite")
    rng = np.random.default_rng(0)
    data = {
        "image": rng.normal(size=(8, 8, 8, 3)).astype(np.float32),
        "filters": rng.normal(size=(8, 1, 1, 3, 4)).astype(np.float32),
    }
    with caplog.at_level(logging.INFO, logger="lpq.tf"):
        result = lpq.quantize(
            str(path),
            lpq.PostTrainingQuantConfig(approach="static", latency_aware=False),
            ArrayLoader(data, batch_size=1),
        )
    said = [r.getMessage() for r in caplog.records if "has no kernel" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("kept fp32: ") and "(CONV_2D)" in said[0]
    assert no_kernel(result.model) is None  # LiteRT loads what was written
    fallen = [key for key, cfg in result.model.tune_cfg.ops.items() if not cfg.quantized]
    assert [op_type for _, op_type in fallen] == ["CONV_2D"]
    ops = lpq.get_plugin_manager().quantized_ops(result.framework, result.model)
    assert ops[fallen[0][0]] == "fp32"
