"""Recurrent models: state links found in calibration streams, errors measured as streams."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpq
from lpq_onnxrt import range_choice, streams
from lpq_onnxrt.latency import blame, cache, fidelity, timing
from lpq_onnxrt.session import create_session

FW = "onnxrt"
STREAMS, CHUNKS, FEATURES, HIDDEN = 4, 8, 16, 32


def _recurrent_model(recurrence: float = 1.0) -> onnx.ModelProto:
    """h = tanh(x W + state U), y = sigmoid(h V); outputs y and h (the next state), like a
    streaming VAD. ``recurrence`` scales U (a model whose state path is a little off)."""
    rng = np.random.default_rng(0)
    weights = {
        "W": rng.normal(0, 0.4, (FEATURES, HIDDEN)),
        "U": recurrence * rng.normal(0, 1.1 / np.sqrt(HIDDEN), (HIDDEN, HIDDEN)),
        "V": rng.normal(0, 0.5, (HIDDEN, 1)),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm_x"),
            helper.make_node("MatMul", ["state", "U"], ["su"], name="mm_state"),
            helper.make_node("Add", ["xw", "su"], ["pre"], name="add"),
            helper.make_node("Tanh", ["pre"], ["stateN"], name="tanh"),
            helper.make_node("MatMul", ["stateN", "V"], ["logit"], name="mm_out"),
            helper.make_node("Sigmoid", ["logit"], ["prob"], name="sigmoid"),
        ],
        "recurrent",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", FEATURES]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, ["n", HIDDEN]),
        ],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["n", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, ["n", HIDDEN]),
        ],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto) -> Any:
    session = create_session(model)
    return lambda feed: session.run(None, dict(feed))


def _recorded_streams(model: onnx.ModelProto, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Calibration feeds as a user records them: STREAMS streams of CHUNKS chunks, each
    chunk's state what fp32 returned for the chunk before (zeros at a stream's start)."""
    rng = np.random.default_rng(seed)
    run = _run(model)
    feeds = []
    for _ in range(STREAMS):
        state = np.zeros((1, HIDDEN), np.float32)
        for _ in range(CHUNKS):
            feed = {"x": rng.normal(0, 1, (1, FEATURES)).astype(np.float32), "state": state}
            feeds.append(feed)
            state = run(feed)[1]
    return feeds


def test_state_links_and_chains_are_found_in_recorded_streams():
    model = _recurrent_model()
    found = streams.find(_run(model), _recorded_streams(model))
    assert found is not None
    assert found.links == {"state": 1}  # the input "state" continues output 1, "stateN"
    assert found.chains == [list(range(s * CHUNKS, (s + 1) * CHUNKS)) for s in range(STREAMS)]


def test_independent_batches_are_not_streams():
    model = _recurrent_model()
    rng = np.random.default_rng(2)
    feeds = [
        {
            "x": rng.normal(0, 1, (1, FEATURES)).astype(np.float32),
            "state": rng.normal(0, 0.3, (1, HIDDEN)).astype(np.float32),
        }
        for _ in range(12)
    ]
    assert streams.find(_run(model), feeds) is None


def test_independent_batches_stop_the_probe_once_no_link_is_possible():
    """16 probe feeds, none continuing the one before: once misses outnumber what the
    remaining feeds could match, no more feeds run (the answer is the same)."""
    model = _recurrent_model()
    rng = np.random.default_rng(3)
    feeds = [
        {
            "x": rng.normal(0, 1, (1, FEATURES)).astype(np.float32),
            "state": rng.normal(0, 0.3, (1, HIDDEN)).astype(np.float32),
        }
        for _ in range(40)
    ]
    runs: list[int] = []
    run = _run(model)

    def counted(feed: Any) -> Any:
        runs.append(1)
        return run(feed)

    assert streams.find(counted, feeds) is None
    pairs = streams.PROBE_FEEDS - 1
    # a link needs matches >= misses: after m misses, pairs - m left to match
    assert len(runs) == pairs // 2 + 1 < streams.PROBE_FEEDS


def test_a_stream_found_late_in_the_probe_still_counts():
    """Independent batches first, then a recorded stream: the probe must not stop while
    the remaining feeds could still make a link."""
    model = _recurrent_model()
    rng = np.random.default_rng(4)
    noise = [
        {
            "x": rng.normal(0, 1, (1, FEATURES)).astype(np.float32),
            "state": rng.normal(0, 0.3, (1, HIDDEN)).astype(np.float32),
        }
        for _ in range(5)
    ]
    feeds = noise + _recorded_streams(model)
    found = streams.find(_run(model), feeds)
    assert found is not None and found.links == {"state": 1}


def test_select_takes_whole_chains_evenly_spread():
    found = streams.Streams({"state": 1}, [list(range(i * 5, i * 5 + 5)) for i in range(4)])
    assert found.select(100) == found.chains
    assert found.select(10) == [found.chains[0], found.chains[2]]
    assert found.select(3) == [[0, 1, 2]]  # even one chain is too long: its start


def test_iter_chains_feeds_the_models_own_state_back():
    model = _recurrent_model()
    feeds = _recorded_streams(model)
    found = streams.find(_run(model), feeds)
    assert found is not None
    # fp32 fed its own state reproduces the recording.
    again = list(streams.iter_chains(_run(model), feeds, found.links, found.chains))
    recorded = [_run(model)(feed) for feed in feeds]
    for got, want in zip(again, recorded, strict=True):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    # A model whose state path is off carries its own (wrong) state: from a stream's third
    # chunk on, its outputs differ from those computed from the recorded state (its first
    # state is all zeros, which U does not change, so the second chunk's state is right).
    drifted = list(
        streams.iter_chains(_run(_recurrent_model(1.3)), feeds, found.links, found.chains)
    )
    per_chunk = [_run(_recurrent_model(1.3))(feed) for feed in feeds]
    for k, (streamed, alone) in enumerate(zip(drifted, per_chunk, strict=True)):
        if k % CHUNKS < 2:
            np.testing.assert_allclose(streamed[1], alone[1])
        else:
            assert not np.allclose(streamed[1], alone[1])


def test_stream_error_shows_what_per_batch_error_hides():
    model = _recurrent_model()
    feeds = _recorded_streams(model)
    found = streams.find(_run(model), feeds)
    drifted = _recurrent_model(1.3)
    per_batch = fidelity.output_error({}, feeds, model)(drifted)
    as_streams = fidelity.output_error({}, feeds, model, found)(drifted)
    assert as_streams > 1.5 * per_batch


def _default_cfg(pm: lpq.PluginManager, model: Any, feeds: Any, **options: Any) -> Any:
    cap = pm.query_capability(FW, model, feeds, {})
    return lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise},
        calib_sampling_size=len(feeds),
        options=options,
    )


def _node_seconds(model: onnx.ModelProto) -> float:
    """Scripted latency: a float compute node costs 1, an int8 one 0.5, a Q/DQ node 0.2
    (so QOperator, with fewer Q/DQ nodes, beats QDQ, and int8 beats fp32), except the
    int8 sigmoid: 3 (so it is kept in fp32)."""
    cost = 0.0
    for node in model.graph.node:
        if node.op_type == "QLinearSigmoid":
            cost += 3.0
        elif node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            cost += 0.2
        elif node.op_type.startswith("QLinear") or node.op_type.endswith("Integer"):
            cost += 0.5
        else:
            cost += 1.0
    return cost


def test_auto_ranges_are_chosen_on_streams_for_the_graph_that_ships(monkeypatch):
    """Latency-aware quantize of a recurrent model: format and fp32 ops are decided first,
    then the ranges on the decided graph, by stream error; the error recorded for the
    choice is the returned model's own."""
    monkeypatch.setattr(cache, "load_cached", lambda folder, key: None)
    monkeypatch.setattr(
        timing,
        "ort_timer",
        lambda options, budget_s=1.0: (
            lambda models, feed: {label: _node_seconds(m) for label, m in models.items()}
        ),
    )
    monkeypatch.setattr(blame, "profile_blame", lambda *a: None)
    pm = lpq.get_plugin_manager()
    model = _recurrent_model()
    feeds = _recorded_streams(model)
    cfg = _default_cfg(pm, model, feeds, latency_aware=True)
    result = pm.quantize(FW, model, cfg, feeds)
    assert result.latency["quant_format"] == "qoperator"
    assert result.latency["fp32_ops"] == ["sigmoid"]
    choice = result.range_choice
    assert set(choice["errors"]) == set(range_choice.CANDIDATES)
    found = streams.find(_run(model), feeds)
    measured = fidelity.output_error({}, feeds, model, found)(result.proto)
    assert measured == pytest.approx(choice["errors"][choice["algorithm"]], rel=1e-4, abs=1e-9)
