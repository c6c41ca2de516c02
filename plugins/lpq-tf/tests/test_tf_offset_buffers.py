"""``.tflite`` files whose constants lie after the flatbuffer (a buffer's ``offset`` and
``size`` instead of inline ``data``), as ai-edge-quantizer writes some: lpq-tf reads those
constants and keeps them when it adds its metadata. Repacked as offsets they pointed past
the end of the file, and LiteRT refused the saved model ("Constant buffer 34 specified an
out of range offset", MediaPipe's BlazeFace quantized by lpq)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
flatbuffers = pytest.importorskip("flatbuffers")

from ai_edge_litert import schema_py_generated as schema  # noqa: E402

from lpq_tf import graph  # noqa: E402
from lpq_tf.model_io import prepare  # noqa: E402
from lpq_tf.runtime import Runner  # noqa: E402


def float_tflite() -> bytes:
    inputs = tf.keras.Input((16,), name="x")
    hidden = tf.keras.layers.Dense(64, activation="relu", name="fc1")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(4, name="fc2")(hidden))
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    return prepare(model).float_tflite


def _pack(model: Any) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def with_largest_buffer_outside(content: bytes) -> tuple[bytes, int]:
    """``content`` with its largest buffer moved after the flatbuffer (16-byte aligned),
    and that buffer's index."""
    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    sizes = [0 if b.data is None else len(b.data) for b in model.buffers]
    index = int(np.argmax(sizes))
    data = bytes(np.asarray(model.buffers[index].data, dtype=np.uint8))
    buffer = model.buffers[index]
    buffer.data, buffer.offset, buffer.size = None, 1, len(data)  # the fields, sized
    start = -(-len(_pack(model)) // 16) * 16
    buffer.offset = start
    packed = _pack(model)
    assert len(packed) <= start
    return packed + bytes(start - len(packed)) + data, index


def run(content: bytes) -> np.ndarray:
    x = np.random.default_rng(1).normal(size=(1, 16)).astype(np.float32)
    return Runner(content).run([x])[0]


def test_constants_after_the_flatbuffer_are_read_and_kept_with_metadata():
    content = float_tflite()
    moved, index = with_largest_buffer_outside(content)
    np.testing.assert_array_equal(run(moved), run(content))  # LiteRT reads the offset

    # lpq-tf's reader sees the moved buffer as the constant it is.
    before, after = graph.read(content), graph.read(moved)
    (tensor,) = [t for t in after.tensors if t.buffer == index]
    np.testing.assert_array_equal(after.constant(tensor.index), before.constant(tensor.index))

    # Metadata added: the file still loads, computes the same and holds the entry.
    saved = graph.with_metadata(moved, {"lpq.test": b"kept"})
    np.testing.assert_array_equal(run(saved), run(content))
    assert graph.read(saved).metadata["lpq.test"] == b"kept"
