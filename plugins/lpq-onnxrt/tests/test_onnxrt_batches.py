"""Large batches run in chunks of samples (:mod:`lpq_onnxrt.batches`): ORT holds every
intermediate tensor of a run at once, so evaluation (the data probe, the fidelity check)
runs a batch in pieces where each sample's outputs are its own, with the same outputs
bit for bit; a model whose outputs depend on the whole batch, or whose batch is fixed,
runs whole, and so does a timed batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxrt_testutil import KeepPredictions

from lpq import LatencyMeasurer
from lpq_onnxrt import batches
from lpq_onnxrt import evaluate as evaluate_module

SAMPLE_BYTES = 3 * 8 * 8 * 4  # one sample of x, float32


def _conv(batch: str | int = "N") -> onnx.ModelProto:
    """Conv -> Relu (a feature map) and its global average (a vector): two outputs on
    one batch axis named ``batch`` (or fixed, given a number)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "B"),
        numpy_helper.from_array(np.array([-1, 4], dtype=np.int64), "flat"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
            helper.make_node("GlobalAveragePool", ["y"], ["g"], name="gap"),
            helper.make_node("Reshape", ["g", "flat"], ["z"], name="flatten"),
        ],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 4]),
        ],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _dynamic() -> onnx.ModelProto:
    """x quantized with the whole batch's range, dequantized: each sample's output
    depends on every sample's values."""
    graph = helper.make_graph(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "zp"], name="dq"),
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="deq"),
        ],
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 8, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _batch(count: int = 10, seed: int = 1) -> np.ndarray:
    """``count`` samples; each sample on its own scale, so that a range taken over some
    samples differs from one over all of them."""
    rng = np.random.default_rng(seed)
    scales = np.linspace(0.5, 5.0, count, dtype=np.float32).reshape(count, 1, 1, 1)
    return (rng.normal(0, 1, (count, 3, 8, 8)).astype(np.float32) * scales).astype(np.float32)


def _evaluate(
    model: onnx.ModelProto,
    data: list[np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    measurer: LatencyMeasurer | None = None,
) -> tuple[list[Any], list[tuple[int, ...]]]:
    """What a metric is given for each batch of ``data``, and the batch size of every
    ORT run."""
    made = evaluate_module.create_session
    runs: list[tuple[int, ...]] = []

    class Watched:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def get_outputs(self) -> Any:
            return self.inner.get_outputs()

        def run(self, names: Any, feed: Any) -> Any:
            runs.append(tuple(np.shape(feed["x"])[:1]))
            return self.inner.run(names, feed)

    monkeypatch.setattr(evaluate_module, "create_session", lambda *a, **k: Watched(made(*a, **k)))
    kept = KeepPredictions()
    evaluate_module.evaluate(model, [(x, None) for x in data], None, [kept], measurer, None)
    return kept.seen, runs


def _same_bits(chunked: list[Any], whole: list[Any]) -> None:
    assert len(chunked) == len(whole)
    for got, want in zip(chunked, whole, strict=True):
        got, want = (got, want) if isinstance(got, list) else ([got], [want])
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


def test_batch_chunks_cut_the_batch_axis_to_fit_the_limit():
    x = _batch(10)
    pieces = batches.batch_chunks({"x": x}, limit=4 * SAMPLE_BYTES)
    assert pieces is not None
    assert [len(piece["x"]) for piece in pieces] == [4, 4, 2]
    assert np.concatenate([piece["x"] for piece in pieces]).tobytes() == x.tobytes()
    # At least one sample a piece, however small the limit.
    tiny = batches.batch_chunks({"x": x}, limit=1)
    assert tiny is not None and [len(piece["x"]) for piece in tiny] == [1] * 10
    # Whole: fits, one sample, or inputs of different batch sizes.
    assert batches.batch_chunks({"x": x}, limit=x.nbytes) is None
    assert batches.batch_chunks({"x": x[:1]}, limit=1) is None
    assert batches.batch_chunks({"x": x, "y": x[:5]}, limit=1) is None
    # The module's limit when none is given, read at call time.
    assert batches.batch_chunks({"x": x}) is None  # 7.5 KB < CHUNK_BYTES
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batches, "CHUNK_BYTES", 5 * SAMPLE_BYTES)
        halves = batches.batch_chunks({"x": x})
    assert halves is not None and [len(piece["x"]) for piece in halves] == [5, 5]


def test_which_models_run_in_chunks():
    """A feed that is cut (over the limit), of a model with a batch axis and no batch-wide
    node: declared, fixed, named apart (seen by running), batch-wide."""
    feed = {"x": _batch(10)}
    small = 4 * SAMPLE_BYTES
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batches, "CHUNK_BYTES", small)
        assert batches.feed_runs_in_chunks(_conv(), _runner(_conv()), feed)
        fixed = _conv(10)
        assert not batches.feed_runs_in_chunks(fixed, _runner(fixed), feed)
        apart = _conv()
        apart.graph.output[1].type.tensor_type.shape.dim[0].dim_param = "M"
        assert batches.feed_runs_in_chunks(apart, _runner(apart), feed)
        dynamic = _dynamic()
        assert batches.shares_batch_axis(dynamic) and batches.batch_wide(dynamic)
        assert not batches.feed_runs_in_chunks(dynamic, _runner(dynamic), feed)
    # A feed that fits is not cut, whatever the model.
    assert not batches.feed_runs_in_chunks(_conv(), _runner(_conv()), feed)


def _runner(model: onnx.ModelProto, calls: list[int] | None = None) -> Any:
    """``run(feed)``: ``model``'s outputs in an ORT session (the batch size of each run
    appended to ``calls``)."""
    from lpq_onnxrt.session import create_session

    session = create_session(model, {})

    def run(feed: dict[str, np.ndarray]) -> list[Any]:
        if calls is not None:
            calls.append(len(feed["x"]))
        return list(session.run(None, feed))

    return run


def test_a_batch_axis_named_apart_is_seen_by_running_two_samples():
    """An exporter that names the output's batch axis apart from the input's (paddle2onnx:
    PP-OCRv4 det): the axis is not declared, but two samples run alone give the rows of
    the two run together."""
    model = _conv()
    model.graph.output[1].type.tensor_type.shape.dim[0].dim_param = "M"
    feed = {"x": _batch(5)}
    assert not batches.shares_batch_axis(model)
    calls: list[int] = []
    assert batches.has_batch_axis(model, _runner(model, calls), feed)
    assert sorted(calls) == [1, 1, 2]  # two samples together, then each alone
    # Declared: nothing run.
    declared: list[int] = []
    assert batches.has_batch_axis(_conv(), _runner(_conv(), declared), feed) and not declared


def _centred(over_batch: bool) -> onnx.ModelProto:
    """x minus its mean over the batch axis (``over_batch``), or over each sample's
    channels; the output's batch axis named apart from the input's."""
    axes = [0] if over_batch else [1]
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=axes, keepdims=1, name="mean"),
            helper.make_node("Sub", ["x", "m"], ["y"], name="centre"),
        ],
        "centred",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 3, 8, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_that_mixes_samples_has_no_batch_axis():
    """Centred over the batch: one sample's output depends on the others, so a batch may
    not run in pieces, whatever the shapes say. Centred per sample: it may."""
    mixing = _centred(over_batch=True)
    assert not batches.has_batch_axis(mixing, _runner(mixing), {"x": _batch(4)})
    own = _centred(over_batch=False)
    assert batches.has_batch_axis(own, _runner(own), {"x": _batch(4)})


def test_a_fixed_batch_or_one_sample_is_not_run_to_see():
    def refuse(feed: dict[str, np.ndarray]) -> list[Any]:
        raise AssertionError("a fixed batch is not run")

    fixed = _conv(10)
    fixed.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "M"
    assert not batches.has_batch_axis(fixed, refuse, {"x": _batch(10)})
    named_apart = _conv()
    named_apart.graph.output[1].type.tensor_type.shape.dim[0].dim_param = "M"
    assert not batches.has_batch_axis(named_apart, refuse, {"x": _batch(1)})

    # A model ORT refuses a batch of one or two: not cut (no error).
    def fail(feed: dict[str, np.ndarray]) -> list[Any]:
        raise RuntimeError("Got invalid dimensions for input: x")

    assert not batches.rows_are_samples(fail, {"x": _batch(4)})


def test_evaluation_runs_a_large_batch_in_chunks_with_the_same_outputs(monkeypatch):
    data = [_batch(10, seed=1), _batch(3, seed=2)]
    whole, whole_runs = _evaluate(_conv(), data, monkeypatch)
    assert whole_runs == [(10,), (3,)]  # under CHUNK_BYTES: whole
    monkeypatch.setattr(batches, "CHUNK_BYTES", 4 * SAMPLE_BYTES)
    chunked, chunked_runs = _evaluate(_conv(), data, monkeypatch)
    assert chunked_runs == [(4,), (4,), (2,), (3,)]
    _same_bits(chunked, whole)
    # Concatenated into arrays of their own, not views of ORT's buffers.
    assert all(array.flags["OWNDATA"] for preds in chunked for array in preds)


def test_evaluation_sees_a_batch_axis_the_shapes_name_apart(monkeypatch):
    """The output's batch axis named apart from the input's (paddle2onnx): the first batch
    is cut after two samples run alone and together show its rows are samples; the same
    outputs as whole."""
    apart = _conv()
    apart.graph.output[1].type.tensor_type.shape.dim[0].dim_param = "M"
    data = [_batch(10, seed=1), _batch(3, seed=2)]
    whole, _ = _evaluate(apart, data, monkeypatch)
    monkeypatch.setattr(batches, "CHUNK_BYTES", 4 * SAMPLE_BYTES)
    chunked, runs = _evaluate(apart, data, monkeypatch)
    assert runs == [(2,), (1,), (1,), (4,), (4,), (2,), (3,)]  # the check, then chunks
    _same_bits(chunked, whole)


def test_a_batch_wide_model_runs_whole(monkeypatch):
    data = [_batch(10)]
    whole, _ = _evaluate(_dynamic(), data, monkeypatch)
    monkeypatch.setattr(batches, "CHUNK_BYTES", 4 * SAMPLE_BYTES)
    got, runs = _evaluate(_dynamic(), data, monkeypatch)
    assert runs == [(10,)]
    _same_bits(got, whole)
    # Why: in pieces, each piece would be quantized with its own range.
    session = evaluate_module.create_session(_dynamic())
    pieces = batches.run_in_chunks(lambda feed: session.run(None, feed), {"x": data[0]})
    assert pieces is not None
    assert pieces[0].tobytes() != np.asarray(whole[0]).tobytes()


def test_a_fixed_batch_runs_whole(monkeypatch):
    monkeypatch.setattr(batches, "CHUNK_BYTES", 4 * SAMPLE_BYTES)
    _, runs = _evaluate(_conv(10), [_batch(10)], monkeypatch)
    assert runs == [(10,)]


def test_a_timed_batch_runs_whole(monkeypatch):
    """A timed batch's latency is the batch's, not its pieces'."""
    monkeypatch.setattr(batches, "CHUNK_BYTES", 4 * SAMPLE_BYTES)
    measurer = LatencyMeasurer(warmup=0)
    _, runs = _evaluate(_conv(), [_batch(10)] * 2, monkeypatch, measurer)
    assert runs == [(10,), (10,)]
    assert measurer.median_ms is not None
