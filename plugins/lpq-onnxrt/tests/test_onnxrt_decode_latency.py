"""A decoder with a KV cache is timed on generation steps (one token after a cache as long
as its windows), not on whole windows from an empty cache: that is its users' latency."""

from __future__ import annotations

import numpy as np
from test_onnxrt_tune_int4_int8 import builder_decoder, tokens

from lpq import LatencyMeasurer
from lpq_onnxrt import evaluate, llm_io
from lpq_onnxrt.data import input_specs


def test_decode_feed_is_one_token_after_the_past():
    specs = input_specs(builder_decoder())
    feed = llm_io.decode_feed(specs, past=40)
    assert feed is not None
    assert feed["input_ids"].shape == (1, 1)
    assert feed["attention_mask"].shape == (1, 41)
    caches = [name for name in feed if llm_io.is_cache_input(name)]
    assert caches and all(feed[name].shape[0] == 1 and 40 in feed[name].shape for name in caches)


def test_a_model_without_cache_inputs_gets_no_decode_feed():
    from lpq_onnxrt.data import InputSpec

    specs = [
        InputSpec("input_ids", np.int64, (None, None)),
        InputSpec("attention_mask", np.int64, (None, None)),
    ]
    assert llm_io.decode_feed(specs, past=8) is None


def _spy_runs(monkeypatch) -> list[tuple[int, int]]:
    """The ``input_ids`` shape of every run of the session ``evaluate`` makes."""
    fed: list[tuple[int, int]] = []
    real = evaluate.runnable

    def spying(*args, **kwargs):
        session, proto, options = real(*args, **kwargs)

        class Spy:
            def __getattr__(self, name):
                return getattr(session, name)

            def run(self, names, feed):
                fed.append(feed["input_ids"].shape)
                return session.run(names, feed)

        return Spy(), proto, options

    monkeypatch.setattr(evaluate, "runnable", spying)
    return fed


class _Count:
    """Counts how many batches were run through ``update``."""

    name, higher_is_better = "count", True

    def __init__(self) -> None:
        self.n = 0

    def reset(self) -> None:
        self.n = 0

    def update(self, preds, labels) -> None:
        self.n += 1

    def result(self) -> float:
        return float(self.n)


def test_decoder_latency_is_timed_on_decode_steps(monkeypatch):
    fed = _spy_runs(monkeypatch)
    windows = [({"input_ids": tokens(2, 24, seed=1)}, None)]
    measurer = LatencyMeasurer(warmup=1)
    result = evaluate.evaluate(builder_decoder(), windows, None, [_Count()], measurer, None)
    assert fed[0] == (2, 24)  # with a metric, the window is scored as given
    steps = fed[1:]
    assert len(steps) == measurer.warmup + evaluate.DECODE_STEPS
    assert all(shape == (1, 1) for shape in steps)
    assert len(measurer.samples) == evaluate.DECODE_STEPS
    assert result.latency_ms == measurer.median_ms
    assert result.metrics == {"count": 1.0}


def test_timing_a_decoder_runs_no_window(monkeypatch):
    """The tuner's latency pass (no metric) cycles its data up to 202 batches: none of
    them is run, only decode steps after a cache as long as the first window."""
    from lpq.tuning.runner import Evaluation

    fed = _spy_runs(monkeypatch)
    pulled = []

    class Windows:
        def __iter__(self):
            for seed in range(2):
                pulled.append(seed)
                yield {"input_ids": tokens(2, 24, seed=seed)}

    evaluation = Evaluation(framework="onnxrt", latency_dataloader=Windows(), latency_warmup=1)
    latency = evaluation.latency(builder_decoder())
    assert latency is not None and latency > 0
    assert fed == [(1, 1)] * (1 + evaluate.DECODE_STEPS)
    assert len(pulled) == 1


def test_a_model_file_is_opened_by_ort_itself(monkeypatch, tmp_path):
    """An fp32 model given as a file that version normalisation keeps as it is (the
    builder's opset 22 with ops onnx cannot convert) is never loaded into a proto with
    its weights: ORT opens the file, and the proto returned is the graph alone."""
    import onnx

    from lpq_onnxrt import model_io

    path = tmp_path / "model.onnx"
    onnx.save_model(
        builder_decoder(),
        str(path),
        save_as_external_data=True,
        location="model.data",
    )

    def no_full_load(*args, **kwargs):
        raise AssertionError("the whole model was loaded")

    monkeypatch.setattr(model_io, "load_file", no_full_load)
    session, proto, _ = evaluate.runnable(str(path))
    assert any(init.data_location == onnx.TensorProto.EXTERNAL for init in proto.graph.initializer)
    expected = evaluate.runnable(builder_decoder())[0]
    feed = llm_io.decode_feed(input_specs(proto), past=3)
    assert feed is not None
    np.testing.assert_allclose(
        session.run(["logits"], feed)[0], expected.run(["logits"], feed)[0], rtol=1e-5, atol=1e-6
    )


def test_a_model_file_normalisation_changes_is_loaded(monkeypatch, tmp_path):
    """A file whose versions lpq converts (a plain opset-22 graph) takes the old path."""
    import onnx
    from onnx import TensorProto, helper

    from lpq_onnxrt import model_io

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    path = tmp_path / "relu.onnx"
    onnx.save_model(model, str(path))
    loaded = []
    real = model_io.load_file

    def counting(file):
        loaded.append(file)
        return real(file)

    monkeypatch.setattr(model_io, "load_file", counting)
    session, proto, _ = evaluate.runnable(str(path))
    assert loaded and model_io.opset_of(proto) <= model_io.MAX_OPSET
    out = session.run(["y"], {"x": np.array([[-1, 2, -3, 4]], np.float32)})[0]
    np.testing.assert_array_equal(out, [[0, 2, 0, 4]])
