"""Weight-only LLM quantization through the ONNX Runtime adaptor (issue 27).

A tiny random Llama-shaped decoder is built here: Gather embedding, per layer
SimplifiedLayerNormalization (default domain, as onnxruntime-genai's builder writes it)
-> q/k/v MatMuls, KV-cache inputs/outputs shaped like the builder's
(``past_key_values.{i}.key`` (batch, kv_heads, past, head_dim)), an o_proj, a SwiGLU MLP,
and a tied ``lm_head``; opset 22 and IR 10 set explicitly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxrt_testutil import decoder_io

import lpq
from lpq.weight_only import dequantize_matmulnbits
from lpq_onnxrt.passes.weight_only import read_report

FW = "onnxrt"
V, H, KVH, HD, FF, LAYERS = 96, 64, 2, 16, 128, 2
KV = KVH * HD


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _layer(i: int, x: str, rng: np.random.Generator, nodes: list, inits: list) -> str:
    """One decoder layer reading hidden state ``x``; returns its output tensor."""
    p = f"l{i}"
    for name, shape in (
        ("q", (H, H)),
        ("k", (H, KV)),
        ("v", (H, KV)),
        ("o", (H, H)),
        ("gate", (H, FF)),
        ("up", (H, FF)),
        ("down", (FF, H)),
    ):
        # o/down small: each layer nudges the residual stream, as in a trained model
        gain = 0.2 if name in ("o", "down") else 1.0
        inits.append(
            _init(f"{p}.{name}.weight", gain * rng.standard_normal(shape) / np.sqrt(shape[0]))
        )
    inits += [
        _init(f"{p}.ln1", 1 + 0.1 * rng.standard_normal(H)),
        _init(f"{p}.ln2", 1 + 0.1 * rng.standard_normal(H)),
    ]
    mk = helper.make_node
    nodes += [
        mk(
            "SimplifiedLayerNormalization",
            [x, f"{p}.ln1"],
            [f"{p}.n1"],
            name=f"{p}.ln1",
            axis=-1,
            epsilon=1e-6,
        ),
        *[
            mk("MatMul", [f"{p}.n1", f"{p}.{w}.weight"], [f"{p}.{w}"], name=f"{p}.{w}_proj")
            for w in "qkv"
        ],
    ]
    for kind, src in (("key", "k"), ("value", "v")):
        nodes += [
            mk("Reshape", [f"{p}.{src}", "kv_shape"], [f"{p}.{src}4"], name=f"{p}.{src}_reshape"),
            mk(
                "Transpose",
                [f"{p}.{src}4"],
                [f"{p}.{src}t"],
                name=f"{p}.{src}_t",
                perm=[0, 2, 1, 3],
            ),
            mk(
                "Concat",
                [f"past_key_values.{i}.{kind}", f"{p}.{src}t"],
                [f"present.{i}.{kind}"],
                name=f"{p}.{kind}_cat",
                axis=2,
            ),
        ]
    nodes += [
        mk("Concat", [f"{p}.v", f"{p}.v"], [f"{p}.vv"], name=f"{p}.vv", axis=-1),
        mk("Concat", [f"{p}.k", f"{p}.k"], [f"{p}.kk"], name=f"{p}.kk", axis=-1),
        mk("Mul", [f"{p}.q", f"{p}.vv"], [f"{p}.qv"], name=f"{p}.qv"),
        mk("Add", [f"{p}.qv", f"{p}.kk"], [f"{p}.attn"], name=f"{p}.attn"),
        mk("MatMul", [f"{p}.attn", f"{p}.o.weight"], [f"{p}.o"], name=f"{p}.o_proj"),
        mk("Add", [x, f"{p}.o"], [f"{p}.h"], name=f"{p}.res1"),
        mk(
            "SimplifiedLayerNormalization",
            [f"{p}.h", f"{p}.ln2"],
            [f"{p}.n2"],
            name=f"{p}.ln2",
            axis=-1,
            epsilon=1e-6,
        ),
        mk("MatMul", [f"{p}.n2", f"{p}.gate.weight"], [f"{p}.gate"], name=f"{p}.gate_proj"),
        mk("MatMul", [f"{p}.n2", f"{p}.up.weight"], [f"{p}.up"], name=f"{p}.up_proj"),
        mk("Sigmoid", [f"{p}.gate"], [f"{p}.sig"], name=f"{p}.sig"),
        mk("Mul", [f"{p}.gate", f"{p}.sig"], [f"{p}.silu"], name=f"{p}.silu"),
        mk("Mul", [f"{p}.silu", f"{p}.up"], [f"{p}.act"], name=f"{p}.act"),
        mk("MatMul", [f"{p}.act", f"{p}.down.weight"], [f"{p}.down"], name=f"{p}.down_proj"),
        mk("Add", [f"{p}.h", f"{p}.down"], [f"{p}.out"], name=f"{p}.res2"),
    ]
    return f"{p}.out"


def tiny_decoder(seed: int = 0, opset: int = 22, outlier: bool = False) -> onnx.ModelProto:
    """The tiny Llama-shaped decoder (see the module docstring). ``outlier`` gives layer 0's
    layer 1's down_proj huge weights on dead channels, so int4 ruins it (a sensitive
    layer)."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((V, H)).astype(np.float32)
    nodes: list = [helper.make_node("Gather", ["embed.weight", "input_ids"], ["emb"], name="embed")]
    inits = [
        _init("embed.weight", table),
        numpy_helper.from_array(np.array([0, 0, KVH, HD], dtype=np.int64), "kv_shape"),
        _init("final_norm", np.ones(H)),
        _init("lm_head.weight", table.T.copy()),
    ]
    x = "emb"
    for i in range(LAYERS):
        x = _layer(i, x, rng, nodes, inits)
    nodes += [
        helper.make_node(
            "SimplifiedLayerNormalization",
            [x, "final_norm"],
            ["nf"],
            name="norm",
            axis=-1,
            epsilon=1e-6,
        ),
        helper.make_node("MatMul", ["nf", "lm_head.weight"], ["logits"], name="lm_head"),
    ]
    if outlier:  # huge weights on dead input channels: harmless in float, but
        # they set every block's int4 scale, so the rest of the weight rounds to zero
        for name, scale in (("l1.gate.weight", 0.0), ("l1.down.weight", 1000.0)):
            tensor = next(t for t in inits if t.name == name)
            value = numpy_helper.to_array(tensor).copy()
            if name.endswith("down.weight"):
                value *= 25.0  # this layer drives the next-token choice
                value[::32] *= scale  # rows whose inputs (dead SwiGLU channels) are 0
            else:
                value[:, ::32] *= scale  # gate columns 0 -> silu(0) = 0
            tensor.CopyFrom(_init(name, value))
    inputs, outputs = decoder_io(V, LAYERS, KVH, HD, position_ids=True)
    graph = helper.make_graph(nodes, "tiny_llama", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _tokens(n: int = 8, length: int = 24, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=(n, length), dtype=np.int64)


def _cfg(pm: Any, model: Any, precision: str = "int4", **weight: Any) -> lpq.TuneConfig:
    """Every weight-only MatMul at ``precision`` with the given weight options."""
    cap = pm.query_capability(FW, model, None, {})
    ops = {}
    for key in cap.opwise:
        for c in cap.op_configs(key):
            if c.mode != "weight_only" or c.precision != precision:
                continue
            if all(getattr(c.weight, k, c.weight.options.get(k)) == v for k, v in weight.items()):
                ops[key] = c
                break
    return lpq.TuneConfig(ops=ops)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _feed(ids: np.ndarray) -> dict[str, np.ndarray]:
    n, length = ids.shape
    feed = {
        "input_ids": ids,
        "attention_mask": np.ones((n, length), np.int64),
        "position_ids": np.tile(np.arange(length), (n, 1)),
    }
    for i in range(LAYERS):
        for kind in ("key", "value"):
            feed[f"past_key_values.{i}.{kind}"] = np.zeros((n, KVH, 0, HD), np.float32)
    return feed


def _logits(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    return _session(model).run(["logits"], _feed(ids))[0]


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


@pytest.fixture
def decoder() -> onnx.ModelProto:
    return tiny_decoder()


@pytest.mark.parametrize("algorithm", ["rtn", "gptq", "awq", "scale_search"])
def test_each_algorithm_quantizes_the_decoder_end_to_end(pm, decoder, algorithm):
    cfg = _cfg(pm, decoder, "int4", algorithm=algorithm, block_size=32)
    qmodel = pm.quantize(FW, decoder, cfg, lpq.ArrayLoader(_tokens(), batch_size=4))
    proto = qmodel.proto
    nbits = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    # 7 per layer; lm_head (tied) is int8 or float as measured on the calibration data
    report = read_report(proto)
    head_int8 = report["lm_head"]["kept"] == "int8"
    assert len(nbits) == 7 * LAYERS + head_int8
    assert report["lm_head"]["tied"] and "measured" in report["lm_head"]
    assert head_int8 or any(n.op_type == "MatMul" and n.name == "lm_head" for n in proto.graph.node)
    assert set(report["accuracy_level"]["int4"]["ms"]) == {"0", "4"} or set(
        report["accuracy_level"]["int4"]["ms"]
    ) == {0, 4}
    ids = _tokens(2, 16, seed=5)
    ref, out = _logits(decoder, ids), _logits(proto, ids)
    assert np.isfinite(out).all()
    agreement = np.mean(ref.argmax(-1) == out.argmax(-1))
    assert agreement > 0.6, agreement
    if algorithm == "awq":
        skipped = report["awq_skipped"]
        assert "l0.o_proj" in skipped and "l0.down_proj" in skipped  # no scale to fold into
        assert "awq_alpha" in report["layers"]["l0.q_proj"]


def test_matmulnbits_output_matches_numpy_dequantized_reference(pm, decoder):
    cfg = _cfg(pm, decoder, "uint4", block_size=32)
    proto = pm.quantize(FW, decoder, cfg, None).proto
    # accuracy_level 0 computes in float: compare one node exactly with numpy
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    node = next(n for n in proto.graph.node if n.name.startswith("l0.up_proj"))
    attrs = {a.name: a.i for a in node.attribute}
    zp = inits[node.input[3]] if len(node.input) > 3 else None
    w = dequantize_matmulnbits(
        inits[node.input[1]],
        inits[node.input[2]],
        zp,
        attrs["K"],
        attrs["N"],
        attrs["bits"],
        attrs["block_size"],
    )
    x = np.random.default_rng(0).standard_normal((5, attrs["K"])).astype(np.float32)
    one = helper.make_node(
        "MatMulNBits",
        ["x", *node.input[1:]],
        ["y"],
        domain="com.microsoft",
        **{**attrs, "accuracy_level": 0},
    )
    g = helper.make_graph(
        [one],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, attrs["K"]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, attrs["N"]])],
        [numpy_helper.from_array(inits[n], n) for n in node.input[1:]],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 10
    y = _session(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
    # and the dequantized weight is close to the float one
    fp = numpy_helper.to_array(
        next(i for i in decoder.graph.initializer if i.name == "l0.up.weight")
    )
    assert np.abs(w - fp).max() < 0.2 * np.abs(fp).max()


def test_int8_weights_and_precision_report(pm, decoder):
    cfg = _cfg(pm, decoder, "int8", block_size=64)
    qmodel = pm.quantize(FW, decoder, cfg, None)
    nbits = [n for n in qmodel.proto.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and all({a.name: a.i for a in n.attribute}["bits"] == 8 for n in nbits)
    found = pm.quantized_ops(FW, qmodel)
    assert found["l0.q_proj"] == "int8" and found["lm_head"] == "fp32"
    ids = _tokens(2, 16, seed=3)
    assert np.mean(_logits(decoder, ids).argmax(-1) == _logits(qmodel.proto, ids).argmax(-1)) > 0.9


def test_lm_head_int8_on_request(pm, decoder):
    cfg = _cfg(pm, decoder, "int4", block_size=32).with_options({"lm_head": "int8"})
    qmodel = pm.quantize(FW, decoder, cfg, None)
    found = pm.quantized_ops(FW, qmodel)
    assert found["lm_head"] == "int8" and found["l1.down_proj"] == "int4"
    report = read_report(qmodel.proto)
    assert report["lm_head"]["kept"] == "int8"
    # the int8 accuracy_level is timed on a decoder MatMul, not on the head
    timed = report["accuracy_level"]["int8"]
    assert timed["layer"] != "lm_head" and "proj" in timed["layer"]
    assert timed["shape"][1] != V


def test_accuracy_level_layer_is_a_capped_decoder_matmul():
    from lpq_onnxrt.passes.weight_only import accuracy_level as levels

    cap = levels.MAX_TIMED_WEIGHTS
    shapes = {"head": (576, 49152), "up": (576, 1536), "q": (576, 576), "huge": (4096, 4096)}
    assert levels.representative(shapes, {"head"}, {"head"}) == "up"  # head excluded
    assert levels.representative(shapes, {"head"}, {"q"}) == "q"  # this bit width first
    assert levels.representative({"huge": (4096, 4096)}, set(), set()) == "huge"
    assert 576 * 1536 <= cap < 576 * 49152
    assert levels.representative({"head": (576, 49152)}, {"head"}, {"head"}) is None


def test_accuracy_level_error_on_weights_already_on_the_grid():
    """SmolLM2's lm_head is exactly on the int8 sym grid (Q8_0 source): the weight error is
    0, and dividing by it reported "extra error 9.7e13". The grid floor keeps it O(1)."""
    from lpq.weight_only import dequantize_blocks, quantize_rtn
    from lpq_onnxrt.passes.weight_only import accuracy_level as levels

    rng = np.random.default_rng(0)
    k, n = 64, 96
    codes = rng.integers(-127, 128, (k, n)).astype(np.float32)
    codes[::32] = 127  # each block's absmax on the grid's end: RTN reproduces the codes
    weight = (codes * np.repeat(rng.uniform(1e-3, 2e-3, (k // 32, n)), 32, 0)).astype(np.float32)
    quantized = quantize_rtn(weight, 8, 32, True)
    deq = dequantize_blocks(
        quantized.codes, quantized.scales, quantized.zero_points, quantized.block_size
    )
    x = rng.standard_normal((64, k)).astype(np.float32)
    assert np.linalg.norm(x @ weight - x @ deq) <= 1e-5 * np.linalg.norm(x @ weight)
    levels._CACHE.clear()
    result = levels.measure(weight, quantized, x)
    assert 0.0 <= result["extra_error"] < 10, result  # was ~1e13
    assert result["extra_rel"] < 0.02 and result["weight_rel"] < 1e-5
    assert levels.grid_error(x, quantized) > 0
    levels._CACHE.clear()


def test_gptq_beats_rtn_on_correlated_inputs(pm):
    rng = np.random.default_rng(0)
    k, n = 128, 64
    mix = rng.standard_normal((k, k)) * np.exp(-np.arange(k) / 8.0)  # strongly correlated
    x = (rng.standard_normal((512, k)) @ mix.T).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", n])],
        [_init("w", w)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    errors = {}
    for algorithm in ("rtn", "gptq"):
        cfg = _cfg(pm, model, "int4", algorithm=algorithm, block_size=32).with_options(
            {"accuracy_level": 0}
        )
        q = pm.quantize(FW, model, cfg, lpq.ArrayLoader(x[:384], batch_size=128))
        y = _session(q.proto).run(None, {"x": x[384:]})[0]
        errors[algorithm] = float(np.mean((y - x[384:] @ w) ** 2))
    assert errors["gptq"] < 0.8 * errors["rtn"], errors


def test_opset_22_model_is_not_down_converted(pm, decoder, tmp_path):
    qmodel = pm.quantize(FW, decoder, _cfg(pm, decoder, "int4", block_size=32), None)
    opsets = {o.domain: o.version for o in qmodel.proto.opset_import}
    assert opsets[""] == 22 and opsets["com.microsoft"] == 1
    assert any(n.op_type == "SimplifiedLayerNormalization" for n in qmodel.proto.graph.node)


def test_external_data_round_trips(pm, decoder, tmp_path):
    src = tmp_path / "model.onnx"
    onnx.save_model(
        decoder, str(src), save_as_external_data=True, location="model.onnx.data", size_threshold=0
    )
    assert (tmp_path / "model.onnx.data").stat().st_size > 10_000
    qmodel = pm.quantize(FW, str(src), _cfg(pm, str(src), "int4", block_size=32), None)
    out = pm.save_model(FW, qmodel, tmp_path / "q" / "model.onnx")
    back = pm.load_model(FW, out)
    ids = _tokens(2, 8)
    np.testing.assert_allclose(
        _logits(back.proto, ids), _logits(qmodel.proto, ids), rtol=1e-5, atol=1e-5
    )


def test_decoder_feeds_are_filled_from_input_ids(pm, decoder):
    ids = _tokens(3, 10)
    result = pm.evaluate(FW, decoder, lpq.ArrayLoader(ids, ids, batch_size=3), [_Argmax()])
    assert result is not None
    assert _Argmax.seen == (3, 10, V)


class _Argmax:
    name = "argmax"
    higher_is_better = True
    seen: tuple[int, ...] = ()

    def reset(self) -> None:
        pass

    def update(self, preds: Any, labels: Any) -> None:
        logits = preds[0] if isinstance(preds, list) else preds
        _Argmax.seen = tuple(np.shape(logits))

    def result(self) -> float:
        return 1.0


class _TokenAgreement:
    """Label-free next-token top-1 agreement with the fp32 logits lpq records (a local
    metric, so the test does not depend on which plugin registers ``token_agreement``)."""

    name = "token_agreement"
    higher_is_better = True

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.same, self.count = 0, 0

    def update(self, preds: Any, labels: Any) -> None:
        cand = preds[0] if isinstance(preds, list) else preds
        ref = labels[0] if isinstance(labels, list) else labels
        match = np.argmax(cand, -1) == np.argmax(ref, -1)
        self.same += int(match.sum())
        self.count += int(match.size)

    def result(self) -> float:
        return self.same / max(self.count, 1)


def test_tuner_keeps_a_sensitive_layer_float(tmp_path):
    model = tiny_decoder(outlier=True)
    path = tmp_path / "tiny.onnx"
    onnx.save_model(model, str(path))
    ids = _tokens(8, 16, seed=7)
    conf = lpq.PostTrainingQuantConfig(
        approach="weight_only",
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.15),
        tuning_criterion=lpq.TuningCriterion(max_trials=10, objective="modelsize"),
    )
    result = lpq.fit(
        str(path),
        conf,
        calib_dataloader=lpq.ArrayLoader(ids, batch_size=4),
        eval_dataloader=lpq.ArrayLoader(ids, batch_size=4),
        eval_metric=_TokenAgreement(),
        workspace=tmp_path / "ws",
    )
    assert result.goal_met, result.verdict
    found = lpq.get_plugin_manager().quantized_ops(FW, result.model)
    assert found["lm_head"] == "fp32"  # tied: kept float
    matmuls = {k: v for k, v in found.items() if k != "lm_head" and ("proj" in k)}
    assert matmuls["l1.down_proj"] == "fp32"  # the sensitive layer, found by its error
    assert list(matmuls.values()).count("int4") >= len(matmuls) - 2, matmuls
