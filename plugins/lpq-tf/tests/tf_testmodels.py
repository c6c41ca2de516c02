"""Small Keras models and scikit-learn digits data for lpq-tf's tests.

Keras is imported by the tests only (never by ``lpq_tf.plugin``). The digits are split
once: the first 400 shuffled images evaluate, the rest train and calibrate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lpq_tf.tfenv import import_tf

import_tf()  # quietly, before Keras imports TensorFlow with its start-up log

import keras  # noqa: E402
from keras import layers  # noqa: E402

import lpq  # noqa: E402


def digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    """NHWC float32 images in [0, 1] and labels: 'eval' (400), 'train' (the rest)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], data.target[order].astype(np.int64)
    return (x[:400], y[:400]) if split == "eval" else (x[400:], y[400:])


def digits_cnn() -> keras.Model:
    """Conv(16)-Conv(32)-MaxPool-Dense(64)-Dense(10), named layers, trained 8 epochs."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
            layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
            layers.MaxPooling2D(name="pool"),
            layers.Flatten(name="flat"),
            layers.Dense(64, activation="relu", name="fc1"),
            layers.Dense(10, name="logits"),
        ],
        name="digits_cnn",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = digits("train")
    model.fit(x, y, epochs=8, batch_size=32, verbose=0)
    return model


def residual_net() -> keras.Model:
    """An untrained functional net with default layer names: conv + BN + ReLU6, a
    depthwise block with a residual Add, global average pooling, a dense head."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1))
    x = layers.Conv2D(8, 3, padding="same")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    y = layers.DepthwiseConv2D(3, padding="same")(x)
    y = layers.ReLU()(y)
    y = layers.Conv2D(8, 1)(y)
    x = layers.Add()([x, y])
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(10)(x)
    return keras.Model(inputs, outputs)


def calib_loader(samples: int = 200) -> lpq.ArrayLoader:
    x, _ = digits("train")
    return lpq.ArrayLoader(x[:samples], batch_size=50)


def eval_loader(samples: int = 400, batch: int = 100) -> lpq.ArrayLoader:
    x, y = digits("eval")
    return lpq.ArrayLoader(x[:samples], y[:samples], batch_size=batch)


def config_for(capability: Any, precision: str, mode: str, **fallbacks: str) -> lpq.TuneConfig:
    """Every op at its first config of ``precision``/``mode``; ``name=fp32`` falls back."""
    ops = {}
    for key in capability.opwise:
        if key[0] in fallbacks:
            ops[key] = lpq.OpConfig.fallback(fallbacks[key[0]])
            continue
        chosen = [
            c for c in capability.op_configs(key) if (c.precision, c.mode) == (precision, mode)
        ]
        ops[key] = chosen[0] if chosen else lpq.OpConfig.fallback()
    return lpq.TuneConfig(ops=ops, calib_sampling_size=100)


def top1(model: Any) -> float:
    """Top-1 accuracy of ``model`` (fp32 or quantized) on the 400 eval digits, in LiteRT."""
    result = lpq.get_plugin_manager().evaluate("tf", model, eval_loader(), [lpq.TopK(1)])
    return float(result.accuracy)


def head_images(count: int, seed: int) -> np.ndarray:
    """(count, 8, 8, 3) float32 in [-1, 1]: the inputs of the small detector heads of
    test_tf_shared_scale.py and test_tf_output_heads.py."""
    return np.random.default_rng(seed).uniform(-1, 1, (count, 8, 8, 3)).astype(np.float32)


def quantized_and_reference(
    model: Any, result: Any, seed: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """The first output of ``result`` (an ``lpq.quantize`` result) and of the Keras
    ``model`` on 8 held-out :func:`head_images`."""
    from lpq.eval.data import ArrayLoader, OutputRecorder

    held_out = head_images(8, seed)
    recorder = OutputRecorder()
    lpq.get_plugin_manager().evaluate(
        result.framework, result.model, ArrayLoader(held_out, batch_size=1), [recorder]
    )
    got = np.concatenate([out[0] if isinstance(out, list) else out for out in recorder.outputs])
    return got, model.predict(held_out, verbose=0)
