"""Standalone activations in a float ``.tflite`` (as MediaPipe ships its models) are fused
into the op before them when lpq-tf prepares the model: the fp32 model computes the same,
and the int8 model has no standalone RELU left (XNNPACK ran MediaPipe's BlazeFace int8
in 18 pieces because of them, 0.18x fp32; fused, in one, 1.5x)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
flatbuffers = pytest.importorskip("flatbuffers")

from ai_edge_litert import schema_py_generated as schema  # noqa: E402

import lpq  # noqa: E402
from lpq.eval.data import ArrayLoader  # noqa: E402
from lpq_tf import graph, simplify  # noqa: E402
from lpq_tf.model_io import prepare  # noqa: E402
from lpq_tf.runtime import Runner  # noqa: E402


def residual_block() -> Any:
    """x -> Dense -> Add(x) -> ReLU -> Dense (the converter fuses the ReLU into the Add)."""
    x = tf.keras.Input((8,), name="x")
    added = tf.keras.layers.Add(name="add")([tf.keras.layers.Dense(8, name="fc")(x), x])
    relu = tf.keras.layers.ReLU(name="relu")(added)
    model = tf.keras.Model(x, tf.keras.layers.Dense(8, name="head")(relu))
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def unfused(content: bytes) -> bytes:
    """``content`` with every fused RELU taken out into a RELU op of its own, as MediaPipe's
    models have them (the converter fuses them; this undoes it)."""
    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    subgraph = model.subgraphs[0]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.RELU
    code.version = 1
    model.operatorCodes.append(code)
    operators = []
    for op in subgraph.operators:
        operators.append(op)
        options = op.builtinOptions
        if getattr(options, "fusedActivationFunction", None) != schema.ActivationFunctionType.RELU:
            continue
        options.fusedActivationFunction = schema.ActivationFunctionType.NONE
        output = op.outputs[0]
        inner = schema.TensorT()
        original = subgraph.tensors[output]
        inner.shape, inner.type, inner.buffer = original.shape, original.type, 0
        inner.name = original.name + b"/before_relu"
        subgraph.tensors.append(inner)
        op.outputs = [len(subgraph.tensors) - 1]
        relu = schema.OperatorT()
        relu.opcodeIndex = len(model.operatorCodes) - 1
        relu.inputs, relu.outputs = [len(subgraph.tensors) - 1], [output]
        operators.append(relu)
    subgraph.operators = operators
    builder = flatbuffers.Builder(len(content) * 2 + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def op_types(content: bytes) -> list[str]:
    return [op.op_type for op in graph.read(content).model_ops()]


def run(content: bytes) -> np.ndarray:
    x = np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
    return Runner(content).run([x])[0]


@pytest.fixture(scope="module")
def mediapipe_style(tmp_path_factory: pytest.TempPathFactory) -> Path:
    content = unfused(prepare(residual_block()).float_tflite)
    assert op_types(content).count("RELU") == 1  # the helper did what it says
    path = tmp_path_factory.mktemp("simplify") / "residual.tflite"
    path.write_bytes(content)
    return path


def test_a_standalone_relu_is_fused_and_the_model_computes_the_same(mediapipe_style: Path):
    content = mediapipe_style.read_bytes()
    prepared = prepare(mediapipe_style)
    assert "RELU" not in op_types(prepared.float_tflite)
    np.testing.assert_array_equal(run(prepared.float_tflite), run(content))
    # Every tensor left is used (ai-edge-quantizer's calibrator reads them all).
    parsed = graph.read(prepared.float_tflite)
    used = {t for op in parsed.ops for t in (*op.inputs, *op.outputs)} | set(parsed.inputs)
    assert used >= set(range(len(parsed.tensors)))


def _graph(*ops: tuple[str, tuple[int, ...], tuple[int, ...]], outputs: tuple[int, ...]) -> Any:
    made = [graph.Op(i, kind, ins, outs) for i, (kind, ins, outs) in enumerate(ops)]
    return graph.Graph(made, [], (0,), outputs, {}, None)


def test_only_an_activation_alone_on_its_producers_output_is_fused():
    # ADD -> RELU: fused.
    one = _graph(("ADD", (0, 0), (1,)), ("RELU", (1,), (2,)), outputs=(2,))
    assert [(f.activation, f.producer, f.tensor) for f in simplify.fusions(one)] == [(1, 0, 1)]
    # The ADD's output is read by another op too, or is a model output: not fused.
    shared = _graph(
        ("ADD", (0, 0), (1,)), ("RELU", (1,), (2,)), ("MUL", (1, 2), (3,)), outputs=(3,)
    )
    assert simplify.fusions(shared) == []
    exposed = _graph(("ADD", (0, 0), (1,)), ("RELU", (1,), (2,)), outputs=(1, 2))
    assert simplify.fusions(exposed) == []
    # A producer whose options have no fused activation: not fused.
    reshaped = _graph(("RESHAPE", (0,), (1,)), ("RELU", (1,), (2,)), outputs=(2,))
    assert simplify.fusions(reshaped) == []


def test_the_int8_model_has_no_standalone_relu(mediapipe_style: Path):
    data = np.random.default_rng(2).normal(size=(32, 8)).astype(np.float32)
    result = lpq.quantize(
        str(mediapipe_style),
        lpq.PostTrainingQuantConfig(approach="static", latency_aware=False),
        ArrayLoader(data, batch_size=1),
    )
    types = op_types(result.model.content)
    assert "ADD" in types and "RELU" not in types


def sparse_convs() -> bytes:
    """A float .tflite whose conv weights are stored sparse behind DENSIFY ops (the
    converter's sparsity optimization; MediaPipe's pose detector ships so)."""
    x = tf.keras.Input((8, 8, 3), name="x")
    hidden = tf.keras.layers.Conv2D(16, 3, padding="same", name="c1")(x)
    model = tf.keras.Model(x, tf.keras.layers.Conv2D(32, 1, name="c2")(hidden))
    rng = np.random.default_rng(0)
    weights = []
    for w in model.get_weights():
        value = rng.normal(size=w.shape).astype(np.float32)
        if value.ndim == 4:
            value[rng.random(value.shape) < 0.8] = 0.0
        weights.append(value)
    model.set_weights(weights)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    return bytes(converter.convert())


def test_sparse_weights_become_constants_and_quantize_as_weights(tmp_path: Path):
    content = sparse_convs()
    assert op_types(content).count("DENSIFY") == 2  # the converter did what it says
    path = tmp_path / "sparse.tflite"
    path.write_bytes(content)
    normalized = prepare(path).float_tflite
    assert op_types(normalized) == ["CONV_2D", "CONV_2D"]
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype(np.float32)
    np.testing.assert_array_equal(Runner(normalized).run([x])[0], Runner(content).run([x])[0])
    # Quantized, the conv weights are weights (symmetric int8), which LiteRT runs: left as
    # DENSIFY outputs they were quantized as activations, and LiteRT had no kernel.
    data = np.random.default_rng(2).normal(size=(16, 8, 8, 3)).astype(np.float32)
    result = lpq.quantize(
        str(path),
        lpq.PostTrainingQuantConfig(approach="static", latency_aware=False),
        ArrayLoader(data, batch_size=1),
    )
    ops = lpq.get_plugin_manager().quantized_ops(result.framework, result.model)
    assert list(ops.values()) == ["int8", "int8"]
