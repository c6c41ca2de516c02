"""Weight-only on an LLM one decoder layer at a time, and the embedding as
GatherBlockQuantized (issue 27, items 2, 4 and 5).

The tiny random Llama-shaped decoder of ``test_onnxrt_weight_only`` is cut into stages
(embedding, layer 0, layer 1, final norm + lm_head); the staged run must compute the
model's own function, and calibrating stage by stage must quantize exactly as the
whole-model calibration did before.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from test_onnxrt_weight_only import FW, LAYERS, V, _cfg, _feed, _logits, _tokens, tiny_decoder

import lpq
from lpq.weight_only import quantize_rtn
from lpq_onnxrt import model_io, precision
from lpq_onnxrt.passes import weight_only
from lpq_onnxrt.passes.weight_only import embedding as emb
from lpq_onnxrt.passes.weight_only import read_report, stages


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


@pytest.fixture
def decoder() -> onnx.ModelProto:
    return tiny_decoder()


def _initializers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}


def _outputs(model: onnx.ModelProto, names: list[str], ids: np.ndarray) -> list[np.ndarray]:
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(names, _feed(ids))


def test_stages_follow_the_decoder_layers(decoder):
    found = stages.plan_stages(decoder)
    assert found is not None
    labels = [s.label for s in found]
    assert labels == ["embedding", "layer 0", "layer 1", "suffix"]
    assert found[0].gather and [n.name for n in found[-1].nodes] == ["norm", "lm_head"]
    assert stages.layer_of("/model/layers.12/attn/qkv_proj/MatMul") == 12
    assert stages.layer_of("/transformer/h.3/mlp/c_fc/MatMul") == 3
    assert stages.layer_of("/lm_head/MatMul") is None
    assert stages.layer_of("/model/embed_tokens/Gather") is None


def test_a_model_without_layer_names_is_not_cut():
    model = tiny_decoder()
    for i, node in enumerate(model.graph.node):
        node.name = f"node_{i}"
    assert stages.plan_stages(model) is None


def test_staged_run_computes_the_model(decoder):
    ids = _tokens(4, 12, seed=7)
    feeds = [_feed(ids[:2]), _feed(ids[2:])]
    plan = stages.plan_stages(decoder)
    assert plan is not None
    run = stages.StagedRun(decoder, feeds, plan)
    got: dict[int, dict[str, np.ndarray]] = {}
    for index in range(len(plan)):
        wanted = ["logits"] if index == len(plan) - 1 else ["l1.n2"] if index == 2 else []
        for batch, stream, values in run.run(index, wanted):
            assert stream == "fp32"
            got.setdefault(batch, {}).update(values)
    for batch, feed_ids in enumerate((ids[:2], ids[2:])):
        logits, n2 = _outputs(decoder, ["logits", "l1.n2"], feed_ids)
        np.testing.assert_allclose(got[batch]["logits"], logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[batch]["l1.n2"], n2, rtol=1e-5, atol=1e-5)
    # only what later stages read was carried: nothing is left after the last stage
    assert all(not state for states in run.values.values() for state in states)


@pytest.mark.parametrize("algorithm", ["gptq", "awq", "scale_search"])
def test_layer_by_layer_quantizes_as_the_whole_model_calibration(
    pm, decoder, algorithm, monkeypatch, caplog
):
    cfg = _cfg(pm, decoder, "int4", algorithm=algorithm, block_size=32).with_options(
        {"accuracy_level": 0, "embedding": "fp32"}
    )
    calib = _tokens(8, 24)
    with caplog.at_level(logging.INFO, logger="lpq_onnxrt"):
        staged = pm.quantize(FW, decoder, cfg, lpq.ArrayLoader(calib, batch_size=4)).proto
    lines = [r.getMessage() for r in caplog.records if "weight-only layer" in r.getMessage()]
    # one progress line per decoder layer, in order (ORT's optimizer may move the final
    # norm and lm_head into the last layer's stage: they follow its KV-cache Concat)
    assert [line.split(" (")[0] for line in lines] == [
        f"weight-only layer {i}" for i in range(LAYERS)
    ]
    # the same pass with the model calibrated whole, in chunks (the path for models that
    # cannot be cut by layer, and what every model did before)
    monkeypatch.setattr(weight_only, "plan_stages", lambda model: None)
    whole = pm.quantize(FW, decoder, cfg, lpq.ArrayLoader(calib, batch_size=4)).proto
    a, b = _initializers(staged), _initializers(whole)
    assert sorted(a) == sorted(b)
    for name in a:
        if name.endswith("_B"):
            assert np.mean(a[name] == b[name]) > 0.999, name
        else:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert read_report(staged)["lm_head"] == read_report(whole)["lm_head"]


def test_the_input_model_is_only_read(pm, decoder):
    prepared = model_io.prepare(decoder).model
    before = prepared.SerializeToString()
    cfg = _cfg(pm, decoder, "int4", algorithm="gptq", block_size=32)
    out = weight_only.weight_only_pass(
        prepared,
        {name: c for (name, _), c in cfg.ops.items()},
        {"accuracy_level": 0},
        lpq.ArrayLoader(_tokens(), batch_size=4),
    )
    assert prepared.SerializeToString() == before
    assert out is not prepared
    assert any(n.op_type == "MatMulNBits" for n in out.graph.node)


def _table(model: onnx.ModelProto) -> np.ndarray:
    return numpy_helper.to_array(
        next(i for i in model.graph.initializer if i.name == "embed.weight")
    )


@pytest.mark.parametrize(("kind", "bits"), [("int8", 8), ("int4", 4)])
def test_gather_block_quantized_matches_the_numpy_reference(pm, decoder, kind, bits):
    cfg = _cfg(pm, decoder, "int4", block_size=32).with_options(
        {"embedding": kind, "lm_head": "fp32", "accuracy_level": 0}
    )
    proto = pm.quantize(FW, decoder, cfg, None).proto
    gbq = [n for n in proto.graph.node if n.op_type == "GatherBlockQuantized"]
    assert len(gbq) == 1 and not any(n.op_type == "Gather" for n in proto.graph.node)
    assert {a.name: a.i for a in gbq[0].attribute}["bits"] == bits
    ids = _tokens(3, 10, seed=4)
    (rows,) = _outputs(proto, ["emb"], ids)
    table = _table(decoder)
    # reference: blocks of 32 along the hidden size of each token's row, symmetric RTN:
    # int4 maps each block's signed extreme to -8 (scale = extreme / -8, negative for a
    # positive extreme), int8 its absmax to 127
    blocks = table.reshape(V, -1, 32).astype(np.float64)
    half = 2 ** (bits - 1)
    if bits == 4:
        hi, lo = blocks.max(axis=-1, keepdims=True), blocks.min(axis=-1, keepdims=True)
        scale = np.where(np.abs(hi) > np.abs(lo), hi, lo) / -half
    else:
        scale = np.abs(blocks).max(axis=-1, keepdims=True) / (half - 1)
    scale = scale.astype(np.float32).astype(np.float64)
    codes = np.clip(np.rint(blocks / scale) + half, 0, 2**bits - 1)
    reference = ((codes - half) * scale).reshape(V, -1)[ids]
    np.testing.assert_allclose(rows, reference, rtol=1e-5, atol=1e-6)
    # within half a step, or one step where int4 clips the side opposite the extreme
    bound = (1.0 if bits == 4 else 0.5) * np.abs(scale).max() + 1e-6
    assert np.abs(rows - table[ids]).max() <= bound
    report = read_report(proto)["embedding"]
    assert report["kept"] == kind and report["reason"] == f"embedding={kind}"


def test_asymmetric_gather_block_quantized_matches_dequantized_codes(decoder):
    table = _table(decoder)
    quantized = emb.quantize_table(table, 4, 32, False)
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    found = emb.find_embedding(model, None)
    assert found is not None and (found.vocab, found.hidden) == table.shape
    emb.write(model, found, quantized)
    ids = _tokens(2, 9, seed=2)
    (rows,) = _outputs(model, ["emb"], ids)
    np.testing.assert_allclose(rows, quantized.dequantize().T[ids], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows, emb.rows(quantized)(ids), rtol=1e-6, atol=1e-7)


def test_tied_int8_head_and_embedding_share_one_table(pm, decoder):
    cfg = _cfg(pm, decoder, "int4", block_size=32).with_options(
        {"embedding": "int8", "lm_head": "int8", "accuracy_level": 0}
    )
    proto = pm.quantize(FW, decoder, cfg, None).proto
    gbq = next(n for n in proto.graph.node if n.op_type == "GatherBlockQuantized")
    head = next(n for n in proto.graph.node if n.name.startswith("lm_head"))
    assert head.op_type == "MatMulNBits" and gbq.input[0] == head.input[1]
    names = {i.name for i in proto.graph.initializer}
    assert "embed.weight" not in names and "lm_head.weight" not in names
    ids = _tokens(2, 10, seed=6)
    (rows,) = _outputs(proto, ["emb"], ids)
    deq = quantize_rtn(_table(decoder).T, 8, 32, True).dequantize().T
    np.testing.assert_allclose(rows, deq[ids], rtol=1e-5, atol=1e-6)
    ref = _logits(decoder, ids)
    assert np.mean(ref.argmax(-1) == _logits(proto, ids).argmax(-1)) > 0.8


@pytest.mark.parametrize(
    ("thresholds", "expected"),
    [({"lm_head_min_agreement": 0.0, "lm_head_max_kl": 1e9}, "int4"), ({}, None)],
)
def test_embedding_auto_follows_its_measurement(pm, decoder, thresholds, expected):
    cfg = _cfg(pm, decoder, "int4", block_size=32).with_options(
        {"embedding": "auto", "accuracy_level": 0, **thresholds}
    )
    proto = pm.quantize(FW, decoder, cfg, lpq.ArrayLoader(_tokens(), batch_size=4)).proto
    report = read_report(proto)["embedding"]
    measured = report["measured"]
    assert set(measured) == {"int4", "int8"}
    for found in measured.values():
        assert 0.0 <= found["top1_agreement"] <= 1.0 and found["mean_kl"] >= 0.0
        assert found["rows"] > 0
    # int8 loses less than int4 on the same windows
    assert measured["int8"]["mean_kl"] <= measured["int4"]["mean_kl"]
    if expected is None:  # default thresholds: whatever the numbers say
        expected = emb.decide(measured, 0.99, 0.01)
    assert report["kept"] == expected
    kinds = [n.op_type for n in proto.graph.node if n.name.startswith("embed")]
    assert kinds == (["Gather"] if expected == "fp32" else ["GatherBlockQuantized"])


def test_embedding_option_is_checked(pm, decoder):
    cfg = _cfg(pm, decoder, "int4", block_size=32).with_options({"embedding": "int2"})
    with pytest.raises(lpq.ConfigError, match="embedding"):
        pm.quantize(FW, decoder, cfg, None)


def test_weight_only_precisions_are_read_from_the_graph(pm, decoder, monkeypatch):
    cfg = _cfg(pm, decoder, "int4", block_size=32).with_options({"lm_head": "int8"})
    qmodel = pm.quantize(FW, decoder, cfg, None)

    def no_session(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a weight-only model needs no ORT session to read its precisions")

    monkeypatch.setattr(precision, "optimized_graph", no_session)
    found = pm.quantized_ops(FW, qmodel)
    assert found["l0.q_proj"] == "int4" and found["lm_head"] == "int8"


def test_sampled_rows_stay_within_their_limit():
    from lpq_onnxrt.passes.weight_only.activations import Need, TensorStats, add

    need = Need(4, sample_rows=10)
    stats = TensorStats.start(need)
    for batch in range(5):
        add(stats, need, np.full((2, 4, 4), float(batch), np.float32))
    sample = stats.sample()
    assert sample.shape == (10, 4)
    assert len(set(sample[:, 0])) >= 3  # rows from several batches, not the last one only
    assert stats.count == 40 and np.allclose(stats.importance(), np.mean(np.arange(5.0) ** 2))


def test_gptq_hessian_weighs_the_first_token_of_attention_inputs_only():
    from lpq_onnxrt.passes.weight_only.activations import Need, TensorStats, add
    from lpq_onnxrt.passes.weight_only.calibrate import ATTENTION

    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    flat = x.reshape(-1, 3).astype(np.float64)
    rows = np.ones((2, 4))
    rows[:, 0] = 4  # each window's first token weighs as its other 3 tokens
    expected = {
        True: 2 * (flat * rows.reshape(-1, 1)).T @ flat / rows.sum(),
        False: 2 * flat.T @ flat / len(flat),
    }
    for first in (True, False):
        need = Need(3, hessian=True, first_token=first)
        stats = TensorStats.start(need)
        add(stats, need, x)
        assert stats.hessian is not None
        np.testing.assert_allclose(stats.hessian.hessian, expected[first], rtol=1e-6)
    assert ATTENTION.search("/model/layers.0/attn/qkv_proj/MatMul")
    assert ATTENTION.search("l0.q_proj") and ATTENTION.search("/model/layers.3/attn/o_proj/MatMul")
    assert not ATTENTION.search("/model/layers.0/mlp/down_proj/MatMul")
    assert not ATTENTION.search("l0.up_proj")
