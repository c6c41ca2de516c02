"""Model and data inputs in every accepted form; bad input gives lpq errors; save/load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq


def two_input_block() -> Any:
    import mxnet as mx
    from mxnet.gluon import nn

    class TwoInputs(nn.HybridBlock):
        def __init__(self) -> None:
            super().__init__(prefix="two_")
            with self.name_scope():
                self.image = nn.Dense(10)
                self.extra = nn.Dense(10)

        def hybrid_forward(self, F: Any, image: Any, extra: Any) -> Any:
            return self.image(image) + self.extra(extra)

    net = TwoInputs()
    net.initialize(mx.init.Xavier())
    return net


def unhybridizable_block() -> Any:
    import mxnet as mx
    from mxnet.gluon import nn

    class NumpyHead(nn.HybridBlock):
        def hybrid_forward(self, F: Any, x: Any) -> Any:
            return F.array(x.asnumpy().clip(0, 1))  # NDArray-only code

    net = nn.HybridSequential(prefix="bad_")
    with net.name_scope():
        net.add(nn.Dense(8), NumpyHead(prefix="numpyhead_"), nn.Dense(4))
    net.initialize(mx.init.Xavier())
    return net


def files(prefix: Path) -> dict[str, Path]:
    return {
        "symbol": prefix.with_name(prefix.name + "-symbol.json"),
        "params": prefix.with_name(prefix.name + "-0000.params"),
        "prefix": prefix,
    }


@pytest.mark.parametrize("form", ["symbol", "params", "prefix"])
def test_exported_model_by_either_file_or_prefix(
    pm: Any, exported: Path, form: str, eval_loader: Any, top1: Any, digits_cnn: Any
) -> None:
    path = files(exported)[form]
    assert pm.detect_framework(path) == "mxnet"
    assert pm.detect_framework(str(path)) == "mxnet"
    from_file = pm.evaluate("mxnet", path, eval_loader, [top1]).accuracy
    assert from_file == pm.evaluate("mxnet", digits_cnn, eval_loader, [top1]).accuracy


def test_detection_declines_everything_else(pm: Any, tmp_path: Path, exported: Path) -> None:
    (tmp_path / "other-symbol.json").write_text(json.dumps({"name": "not a graph"}))
    (tmp_path / "lonely-0000.params").write_bytes(files(exported)["params"].read_bytes())
    for model in (
        tmp_path / "other-symbol.json",  # JSON, but no MXNet graph
        tmp_path / "lonely-0000.params",  # parameters without a symbol file
        tmp_path / "lonely",
        np.zeros((2, 2)),
        "model.onnx",
    ):
        with pytest.raises(lpq.NoAdaptorError):
            pm.detect_framework(model)


def test_not_a_gluon_block_is_a_model_error(pm: Any, calib_loader: Any, eval_loader: Any) -> None:
    with pytest.raises(lpq.ModelError, match="HybridBlock"):
        pm.evaluate("mxnet", np.zeros((2, 64)), eval_loader, [])
    with pytest.raises(lpq.ModelError, match="HybridBlock"):
        pm.quantize("mxnet", object(), lpq.TuneConfig(), calib_loader)


def test_a_plain_gluon_block_is_refused_by_name(pm: Any, calib_loader: Any) -> None:
    from mxnet.gluon import nn

    class Imperative(nn.Block):
        def forward(self, x: Any) -> Any:
            return x * 2

    with pytest.raises(lpq.ModelError, match=r"Imperative .* is a gluon\.Block"):
        pm.query_capability("mxnet", Imperative(prefix="imp_"), calib_loader, {})


def test_an_unhybridizable_layer_is_named(pm: Any) -> None:
    data = lpq.ArrayLoader(np.random.default_rng(0).random((8, 16), dtype=np.float32))
    with pytest.raises(lpq.ModelError, match=r"layer NumpyHead \(bad_numpyhead\)"):
        pm.query_capability("mxnet", unhybridizable_block(), data, {})


def test_uninitialized_parameters_say_what_to_do(pm: Any, calib_loader: Any) -> None:
    from mxnet.gluon import nn

    with pytest.raises(lpq.ModelError, match=r"initialize"):
        pm.query_capability("mxnet", nn.Dense(3), calib_loader, {})


def test_two_inputs_as_tuples_or_dicts(pm: Any) -> None:
    rng = np.random.default_rng(0)
    image = rng.random((64, 12), dtype=np.float32)
    extra = rng.random((64, 4), dtype=np.float32)
    labels = rng.integers(0, 10, 64)
    net = two_input_block()
    as_tuples = [
        ((image[i : i + 16], extra[i : i + 16]), labels[i : i + 16]) for i in range(0, 64, 16)
    ]
    as_dicts = lpq.ArrayLoader({"data0": image, "data1": extra}, labels, batch_size=16)
    cap = pm.query_capability("mxnet", net, as_tuples, {})
    assert [t for _, t in cap.opwise] == ["FullyConnected", "FullyConnected", "elemwise_add"]
    cfg = lpq.TuneConfig(
        ops={k: cap.default_op_config(k) for k in cap.opwise}, calib_sampling_size=64
    )
    qnet = pm.quantize("mxnet", net, cfg, as_dicts)
    assert set(pm.quantized_ops("mxnet", qnet).values()) == {"int8"}
    top1 = pm.create_metric("top1")
    fp32 = pm.evaluate("mxnet", net, as_tuples, [top1])
    int8 = pm.evaluate("mxnet", qnet, as_dicts, [top1])
    assert fp32.samples == int8.samples == 64
    wrong = lpq.ArrayLoader({"image": image, "extra": extra}, labels, batch_size=16)
    with pytest.raises(lpq.DataError, match=r"the model takes \['data0', 'data1'\]"):
        pm.evaluate("mxnet", qnet, wrong, [top1])


def test_wrong_number_of_inputs_is_a_data_error(
    pm: Any, digits_cnn: Any, digits: dict[str, Any]
) -> None:
    x = digits["test_x"][:8]
    with pytest.raises(lpq.DataError, match="holds 2 input"):
        pm.evaluate("mxnet", digits_cnn, [((x, x), None)], [])


def test_save_writes_symbol_params_and_tune_cfg(
    pm: Any, digits_cnn: Any, calib_loader: Any, tmp_path: Path
) -> None:
    cap = pm.query_capability("mxnet", digits_cnn, calib_loader, {})
    cfg = lpq.TuneConfig(ops={k: cap.default_op_config(k) for k in cap.opwise})
    qnet = pm.quantize("mxnet", digits_cnn, cfg, calib_loader)
    written = pm.save_model("mxnet", qnet, tmp_path / "out" / "model")
    assert written == tmp_path / "out" / "model-symbol.json"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "model-0000.params",
        "model-lpq.json",
        "model-symbol.json",
    ]  # fmt: skip  (no temporaries left behind)
    meta = json.loads((tmp_path / "out" / "model-lpq.json").read_text())
    assert meta["precision"] == "int8" and meta["inputs"] == ["data"]
    assert lpq.TuneConfig.from_json(meta["tune_cfg"]) == cfg
    head = (tmp_path / "out" / "model-0000.params").read_bytes()[:8]
    assert head == (0x112).to_bytes(8, "little"), "MXNet's NDArray format, not a pickle"


def test_load_refuses_mixed_or_missing_files(
    pm: Any, digits_cnn: Any, exported: Path, tmp_path: Path
) -> None:
    saved = pm.save_model("mxnet", digits_cnn, tmp_path / "a" / "model")
    params = saved.with_name("model-0000.params")
    params.write_bytes(files(exported)["params"].read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(lpq.ModelError, match="does not belong"):
        pm.load_model("mxnet", saved)
    params.unlink()
    with pytest.raises(lpq.ModelError, match="no parameter file"):
        pm.load_model("mxnet", saved)
    with pytest.raises(lpq.ModelError, match="not an MXNet model"):
        pm.load_model("mxnet", tmp_path / "nothing-symbol.json")


def test_a_plain_export_loads_as_fp32(pm: Any, exported: Path, eval_loader: Any, top1: Any) -> None:
    model = pm.load_model("mxnet", exported)
    assert set(pm.quantized_ops("mxnet", model).values()) == {"fp32"}
    assert pm.evaluate("mxnet", model, eval_loader, [top1]).accuracy > 0.95
