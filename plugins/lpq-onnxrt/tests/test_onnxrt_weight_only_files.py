"""Weight-only on LLM-shaped files: external data saved as a pair, the tied embedding kept
once, lm_head chosen by measurement, and no full-model copies (a memory guard)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from test_onnxrt_weight_only import FW, H, V, _cfg, _feed, _tokens, tiny_decoder

import lpq
from lpq_onnxrt import model_io, persist, weights
from lpq_onnxrt.passes.weight_only import read_report


def _builder_style(seed: int = 0) -> onnx.ModelProto:
    """The tiny decoder with the embedding read through Transpose(lm_head weight), as
    onnxruntime-genai's builder exports a tied head."""
    model = tiny_decoder(seed)
    graph = model.graph
    keep = [init for init in graph.initializer if init.name != "embed.weight"]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    graph.node.insert(
        0, helper.make_node("Transpose", ["lm_head.weight"], ["embed.weight"], perm=[1, 0])
    )
    return model


def _logits(model: onnx.ModelProto | str, ids: np.ndarray) -> np.ndarray:
    src = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return session.run(["logits"], _feed(ids))[0]


@pytest.fixture
def pm() -> lpq.PluginManager:
    return lpq.get_plugin_manager()


def _tables(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.initializer if sorted(i.dims) == sorted([V, H])]


def test_tied_embedding_is_stored_once(pm):
    model = _builder_style()
    cfg = _cfg(pm, model, "int4", block_size=32).with_options({"lm_head": "fp32"})
    qmodel = pm.quantize(FW, model, cfg, None)
    assert _tables(qmodel.proto) == ["lm_head.weight"]  # the Gather reads it transposed
    ids = _tokens(2, 12, seed=4)
    ref, out = _logits(model, ids), _logits(qmodel.proto, ids)
    assert np.mean(ref.argmax(-1) == out.argmax(-1)) > 0.8
    # a quantized head: the embedding keeps the fp32 table, the float head weight goes
    cfg8 = _cfg(pm, model, "int4", block_size=32).with_options({"lm_head": "int8"})
    q8 = pm.quantize(FW, model, cfg8, None)
    assert len(_tables(q8.proto)) == 1 and "lm_head.weight" not in _tables(q8.proto)


def test_lm_head_chosen_by_measurement_and_recorded(pm):
    model = tiny_decoder()
    calib = lpq.ArrayLoader(_tokens(), batch_size=4)
    cfg = _cfg(pm, model, "int4", block_size=32)
    report = read_report(pm.quantize(FW, model, cfg, calib).proto)["lm_head"]
    measured = report["measured"]
    assert measured["rows"] > 0 and 0.0 <= measured["int8_top1_agreement"] <= 1.0
    assert report["kept"] == (
        "int8"
        if measured["int8_top1_agreement"] >= 0.99 and measured["int8_mean_kl"] <= 0.01
        else "fp32"
    )
    strict = cfg.with_options({"lm_head_min_agreement": 1.01})
    qmodel = pm.quantize(FW, model, strict, calib)
    report = read_report(qmodel.proto)["lm_head"]
    assert report["kept"] == "fp32" and "costs" in report["reason"]
    assert pm.quantized_ops(FW, qmodel)["lm_head"] == "fp32"
    loose = cfg.with_options({"lm_head_min_agreement": 0.0, "lm_head_max_kl": 1e9})
    qmodel = pm.quantize(FW, model, loose, calib)
    assert read_report(qmodel.proto)["lm_head"]["kept"] == "int8"
    assert pm.quantized_ops(FW, qmodel)["lm_head"] == "int8"


def test_external_data_round_trip_written_as_a_pair(pm, tmp_path, monkeypatch):
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    onnx.save_model(
        _builder_style(),
        str(src),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    before = {p.name: p.read_bytes() for p in src.parent.iterdir()}
    monkeypatch.setattr(persist, "EXTERNAL_ABOVE", 1)
    cfg = _cfg(pm, str(src), "int4", block_size=32)
    qmodel = lpq.QuantizedModel(pm.quantize(FW, str(src), cfg, None), FW, cfg)
    out = qmodel.save(tmp_path / "out" / "model.onnx")
    assert sorted(p.name for p in Path(out).parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert {p.name: p.read_bytes() for p in src.parent.iterdir()} == before  # input untouched
    light = onnx.load(str(out), load_external_data=False)
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in light.graph.initializer)
    ids = _tokens(2, 10, seed=6)
    np.testing.assert_allclose(_logits(str(out), ids), _logits(qmodel.model.proto, ids), atol=1e-5)
    loaded = lpq.load(out, framework=FW) if hasattr(lpq, "load") else None
    if loaded is not None:
        assert read_report(loaded.model.proto) == read_report(qmodel.model.proto)


def test_failed_save_leaves_no_half_pair(pm, tmp_path, monkeypatch):
    model = tiny_decoder()
    qmodel = pm.quantize(FW, model, _cfg(pm, model, "int4", block_size=32), None)
    monkeypatch.setattr(persist, "EXTERNAL_ABOVE", 1)

    def broken(*args, **kwargs):
        Path(args[1]).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(weights, "write_split", broken)
    with pytest.raises(OSError):
        persist.save(qmodel, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_no_full_model_serialized_for_prepare_and_calibration(pm, tmp_path, monkeypatch):
    """Memory guard (not timed): with every weight detached, no ORT session that
    preparing and GPTQ's calibration create gets the weights inside the model bytes,
    and the weights are read from the external file once."""
    monkeypatch.setattr(weights, "MIN_BYTES", 1024)
    src = tmp_path / "model.onnx"
    model = tiny_decoder()
    onnx.save_model(
        model, str(src), save_as_external_data=True, location="w.data", size_threshold=1024
    )
    weight_bytes = sum(weights.nbytes(i) for i in model.graph.initializer)
    sizes: list[int] = []
    real = ort.InferenceSession.__init__

    def counting(self, source, *args, **kwargs):
        if isinstance(source, bytes):
            sizes.append(len(source))
        real(self, source, *args, **kwargs)

    reads: list[str] = []
    real_value = weights._value
    monkeypatch.setattr(
        weights, "_value", lambda t, b: reads.append(f"{b}/{t.name}") or real_value(t, b)
    )
    monkeypatch.setattr(ort.InferenceSession, "__init__", counting)
    model_io.prepare(str(src))
    assert sizes and max(sizes) < weight_bytes / 4, sizes
    first = [name for name in reads if name.startswith(f"{tmp_path}/")]
    assert len(first) == len(set(first))  # the input's external data read once each
    sizes.clear()
    cfg = _cfg(pm, str(src), "int4", algorithm="gptq", block_size=32)
    pm.quantize(FW, str(src), cfg, lpq.ArrayLoader(_tokens(), batch_size=4))
    assert max(sizes) < weight_bytes / 2, sizes  # only the int4 model (precision report)
    assert os.listdir(tmp_path) == ["model.onnx", "w.data"] or sorted(os.listdir(tmp_path)) == [
        "model.onnx",
        "w.data",
    ]
