"""An input model that is already quantized: recognised and said so before calibration;
its float ops away from the quantized part quantized, or a refusal with the reason.

The quantized inputs are made by ONNX Runtime's own quantize_static / quantize_dynamic
from the digits CNN (Conv, Conv, Gemm, MatMul)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import lpq
from lpq_onnxrt import model_io
from lpq_onnxrt.passes import static_plan

FW = "onnxrt"


class _Reader:
    def __init__(self, x: np.ndarray) -> None:
        self.items = iter({"input": x[i : i + 1]} for i in range(min(len(x), 20)))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.items, None)

    def rewind(self) -> None:  # older ORT versions call it
        pass


@pytest.fixture(scope="module")
def quantized_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    from lpq_onnxrt.examples import digits_example

    files = digits_example()
    with np.load(files["calib"]) as calib:
        x = calib["input"]
    folder = tmp_path_factory.mktemp("already-quantized")
    made = {name: folder / f"{name}.onnx" for name in ("dynamic", "qdq", "convs_qoperator")}

    class Reader(_Reader, CalibrationDataReader):  # type: ignore[misc]
        pass

    quantize_dynamic(files["model"], made["dynamic"], weight_type=QuantType.QInt8)
    quantize_static(
        files["model"], made["qdq"], Reader(x), quant_format=QuantFormat.QDQ, per_channel=True
    )
    quantize_static(
        files["model"],
        made["convs_qoperator"],
        Reader(x),
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=["Conv"],
    )
    return made


def _quantize(path: Path, calib_loader: lpq.ArrayLoader, **options: Any) -> Any:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability(FW, str(path), calib_loader, {})
    cfg = lpq.TuneConfig(ops={k: cap.default_op_config(k) for k in cap.opwise}, options=options)
    return pm.quantize(FW, str(path), cfg, calib_loader)


def test_quantized_nodes_are_counted_by_type(quantized_inputs, lpq_sample_model):
    assert model_io.quantized_nodes(onnx.load(str(lpq_sample_model))) == {}
    dynamic = model_io.quantized_nodes(onnx.load(str(quantized_inputs["dynamic"])))
    assert dynamic == {"DynamicQuantizeLinear": 4, "ConvInteger": 2, "MatMulInteger": 2}
    qdq = model_io.quantized_nodes(onnx.load(str(quantized_inputs["qdq"])))
    assert set(qdq) == {"QuantizeLinear", "DequantizeLinear"}
    qop = model_io.quantized_nodes(onnx.load(str(quantized_inputs["convs_qoperator"])))
    assert qop["QLinearConv"] == 2
    assert "2 QLinearConv" in model_io.describe_quantized(qop)


@pytest.mark.parametrize("name", ["dynamic", "qdq"])
def test_a_fully_quantized_model_is_refused_before_calibration(
    quantized_inputs, calib_loader, monkeypatch, name
):
    """Nothing float is left away from the quantized part: a ModelError that says the
    input is already quantized, raised before any calibration (which would fail deep in
    ORT's quantizer, or build a graph with two nodes of one name)."""

    def no_calibration(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("calibrated an already-quantized model")

    monkeypatch.setattr(static_plan._Candidates, "__init__", no_calibration)
    with pytest.raises(lpq.ModelError) as raised:
        _quantize(quantized_inputs[name], calib_loader, latency_aware=True)
    message = str(raised.value)
    assert "is already quantized" in message and name + ".onnx" in message
    assert "float model" in (raised.value.hint or "")


def test_float_ops_beside_a_quantized_part_are_quantized_with_a_warning(
    quantized_inputs, calib_loader, eval_loader, caplog
):
    """Convs quantized by ORT (QOperator), the Gemm and MatMul still float: those two are
    quantized (static QDQ), the model is valid and as accurate, and a warning says the
    input was already quantized."""
    path = quantized_inputs["convs_qoperator"]
    with caplog.at_level(logging.WARNING, logger="lpq_onnxrt"):
        result = _quantize(path, calib_loader, quant_format="qdq")
    assert any("is already quantized" in r.getMessage() for r in caplog.records)
    quantized = {name for (name, _), cfg in result.tune_cfg.ops.items() if cfg.quantized}
    assert quantized == {"fc1", "fc2_matmul"}
    names = [node.name for node in result.proto.graph.node]
    assert len(names) == len(set(names))
    onnx.checker.check_model(result.proto)
    pm = lpq.get_plugin_manager()
    before = pm.evaluate(FW, str(path), eval_loader, [lpq.TopK(1)])
    after = pm.evaluate(FW, result, eval_loader, [lpq.TopK(1)])
    assert after.accuracy >= before.accuracy - 0.03
    kinds = {node.op_type for node in result.proto.graph.node}
    assert "QLinearConv" in kinds  # what was quantized stays as it was


def test_ops_next_to_the_quantized_part_stay_as_they_are(quantized_inputs, calib_loader, caplog):
    """A plan that asks for every op of a partly quantized model: the ops that read or
    write a tensor the quantized part quantizes fall back (said in the warning)."""
    model = onnx.load(str(quantized_inputs["convs_qoperator"]))
    touched = model_io.quantized_tensors(model)
    near = [
        node.name
        for node in model.graph.node
        if not model_io.is_quantized_node(node) and touched & {*node.input, *node.output}
    ]
    assert near, "the Relus after the QLinearConvs read their DequantizeLinear outputs"
    assert not {"fc1", "fc2_matmul"} & set(near)
