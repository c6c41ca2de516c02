"""Quantizing the trained digits CNN: accuracy in LiteRT, and what the .tflite really holds.

Every precision below is read back from the converted flatbuffer (lpq_quantized_ops and
lpq_tf.graph), never taken from the tune_cfg that asked for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tf_testmodels import calib_loader, config_for, top1

import lpq
from lpq_tf import graph

pm = lpq.get_plugin_manager()


def ops_by_type(model: Any) -> dict[str, list[str]]:
    """Output dtype of every op of the quantized .tflite, grouped by op type."""
    parsed = graph.read(model.content)
    found: dict[str, list[str]] = {}
    for op in parsed.ops:
        found.setdefault(op.op_type, []).append(np.dtype(parsed.tensors[op.outputs[0]].dtype).name)
    return found


@pytest.mark.parametrize(
    ("precision", "mode", "expected"),
    [("int8", "static", "int8"), ("int16", "static", "int16"), ("int8", "dynamic", None)],
    ids=["int8-static", "16x8", "dynamic"],
)
def test_quantized_cnn_keeps_accuracy_within_1_percent(
    cnn: Any, cnn_capability: Any, cnn_fp32_accuracy: float, precision: str, mode: str,
    expected: str | None,
) -> None:  # fmt: skip
    cfg = config_for(cnn_capability, precision, mode)
    qmodel = pm.quantize("tf", cnn, cfg, calib_loader())
    assert qmodel.backend == "tflite-converter"
    assert cnn_fp32_accuracy > 0.9
    assert top1(qmodel) >= cnn_fp32_accuracy - 0.01
    found = pm.quantized_ops("tf", qmodel)
    assert set(found) == {"conv1", "conv2", "fc1", "logits"}
    if expected is not None:  # full integer: every listed op runs in the integer type
        assert set(found.values()) == {expected}
        assert set(ops_by_type(qmodel)["CONV_2D"]) == {"int16" if precision == "int16" else "int8"}
    else:
        # Dynamic range: the converter leaves weights under 1024 values in float (conv1 has
        # 144, logits 640); lpq reports that instead of the plan.
        assert found == {"conv1": "fp32", "conv2": "int8", "fc1": "int8", "logits": "fp32"}


@pytest.mark.parametrize(
    ("precision", "backend"),
    [("int8", "tflite-converter"), ("int16", "ai-edge-quantizer")],
    ids=["int8-denylist", "16x8-recipe"],
)
def test_fp32_fallback_leaves_exactly_the_named_ops_float(
    cnn: Any, cnn_capability: Any, cnn_fp32_accuracy: float, precision: str, backend: str
) -> None:
    cfg = config_for(cnn_capability, precision, "static", conv1="fp32", fc1="fp32")
    qmodel = pm.quantize("tf", cnn, cfg, calib_loader())
    assert qmodel.backend == backend
    integer = "int16" if precision == "int16" else "int8"
    assert pm.quantized_ops("tf", qmodel) == {
        "conv1": "fp32",
        "conv2": integer,
        "fc1": "fp32",
        "logits": integer,
    }
    # The same, straight from the flatbuffer: one float and one integer op of each type.
    ops = ops_by_type(qmodel)
    assert sorted(ops["CONV_2D"]) == sorted(["float32", integer])
    assert sorted(ops["FULLY_CONNECTED"]) == sorted(["float32", integer])
    assert top1(qmodel) >= cnn_fp32_accuracy - 0.01


def test_original_keras_model_is_not_modified(cnn: Any, cnn_capability: Any) -> None:
    before = [w.numpy().copy() for w in cnn.weights]
    pm.quantize("tf", cnn, config_for(cnn_capability, "int8", "static"), calib_loader())
    for a, b in zip(before, cnn.weights):
        np.testing.assert_array_equal(a, b.numpy())


def test_int8_io_backend_profile_makes_an_integer_only_model(
    cnn: Any, cnn_fp32_accuracy: float
) -> None:
    conf = lpq.PostTrainingQuantConfig(approach="static", backend="tflite-int8-io")
    qmodel = lpq.quantize(cnn, conf, calib_loader()).model
    parsed = graph.read(qmodel.content)
    assert parsed.tensors[parsed.inputs[0]].dtype == np.int8
    assert parsed.tensors[parsed.outputs[0]].dtype == np.int8
    # lpq quantizes the float eval data with the input's scale and dequantizes the logits.
    assert top1(qmodel) >= cnn_fp32_accuracy - 0.01


def test_float_tflite_input_goes_through_ai_edge_quantizer(
    cnn: Any, cnn_fp32_accuracy: float, tmp_path: Path
) -> None:
    float_file = pm.save_model("tf", cnn, tmp_path / "digits")  # the float .tflite
    assert float_file.suffix == ".tflite" and pm.detect_framework(float_file) == "tf"
    capability = pm.query_capability("tf", float_file, None, {})
    assert len(capability.opwise) == 4
    cfg = config_for(capability, "int8", "static")
    qmodel = pm.quantize("tf", float_file, cfg, calib_loader())
    assert qmodel.backend == "ai-edge-quantizer"
    assert set(pm.quantized_ops("tf", qmodel).values()) == {"int8"}
    assert top1(qmodel) >= cnn_fp32_accuracy - 0.01


def test_mixed_int8_and_16x8_per_op(cnn: Any, cnn_capability: Any, cnn_fp32_accuracy: float):
    cfg = config_for(cnn_capability, "int8", "static")
    sixteen = config_for(cnn_capability, "int16", "static")
    cfg = cfg.with_ops({key: sixteen.ops[key] for key in sixteen.ops if key[0] == "logits"})
    qmodel = pm.quantize("tf", cnn, cfg, calib_loader())
    assert qmodel.backend == "ai-edge-quantizer"
    found = pm.quantized_ops("tf", qmodel)
    assert found["logits"] == "int16" and found["conv1"] == found["fc1"] == "int8"
    assert top1(qmodel) >= cnn_fp32_accuracy - 0.01


def test_fp16_conversion_of_named_ops(cnn: Any, cnn_capability: Any) -> None:
    qmodel = pm.quantize("tf", cnn, config_for(cnn_capability, "int8", "static"), calib_loader())
    converted = pm.convert_bf16("tf", qmodel, ["fc1"], "fp16")
    found = pm.quantized_ops("tf", converted)
    assert found["fc1"] == "fp16" and found["conv2"] == "int8"
    fp16_only = pm.convert_bf16("tf", cnn, ["conv1", "logits"], "fp16")
    assert pm.quantized_ops("tf", fp16_only) == {
        "conv1": "fp16", "conv2": "fp32", "fc1": "fp32", "logits": "fp16"
    }  # fmt: skip
    with pytest.raises(lpq.ModelError, match="bf16"):
        pm.convert_bf16("tf", cnn, ["fc1"], "bf16")


def test_inspected_int8_activations_track_fp32_under_keras_names(
    cnn: Any, cnn_capability: Any
) -> None:
    from tf_testmodels import eval_loader

    qmodel = pm.quantize("tf", cnn, config_for(cnn_capability, "int8", "static"), calib_loader())
    fp32 = pm.inspect_tensor("tf", cnn, eval_loader(), None, "both", 2)
    int8 = pm.inspect_tensor("tf", qmodel, eval_loader(), None, "both", 2)
    assert list(fp32.activations) == ["conv1", "conv2", "fc1", "logits"]
    for name in fp32.activations:
        assert len(int8.activations[name]) == 2
        a, b = fp32.activations[name][0], int8.activations[name][0]
        assert np.linalg.norm(a - b) / np.linalg.norm(a) < 0.1, name
    # Weights: fp32 kernels and their int8 (dequantized) counterparts, close but not equal.
    fp32_kernel = next(iter(fp32.weights["conv2"].values()))
    int8_kernel = next(iter(int8.weights["conv2"].values()))
    assert fp32_kernel.shape == int8_kernel.shape
    assert 0 < np.abs(fp32_kernel - int8_kernel).max() < 0.05 * np.abs(fp32_kernel).max()
    # The last op's output is the model's output: a check that LiteRT kept the tensor.
    keras_logits = cnn.predict(eval_loader().inputs[:100], verbose=0)
    np.testing.assert_allclose(fp32.activations["logits"][0], keras_logits, atol=1e-4)


def test_fp32_baseline_is_the_faster_of_keras_and_float_tflite(cnn: Any) -> None:
    from tf_testmodels import eval_loader

    from lpq_tf.model_io import prepare

    measured = pm.evaluate("tf", cnn, eval_loader(), [lpq.TopK(1)], measurer=lpq.LatencyMeasurer())
    cache = prepare(cnn).cache
    timings = cache["fp32_runtime_ms"]
    assert set(timings) == {"keras", "litert"} and all(ms > 0 for ms in timings.values())
    assert cache["fp32_runtime"] == min(timings, key=timings.__getitem__)
    assert measured.latency_ms is not None and measured.latency_ms > 0
    # Both forms compute the same model: the accuracy does not depend on the choice.
    assert measured.accuracy == pm.evaluate("tf", cnn, eval_loader(), [lpq.TopK(1)]).accuracy


def test_the_fidelity_gates_timing_rounds_make_one_interpreter_per_model(
    cnn: Any, cnn_capability: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate times fp32 and int8 in alternating rounds, one ``evaluate`` each per
    round; inside its ``lpq.runtimes_kept`` scope each model's interpreter is made once."""
    from lpq.eval import fidelity
    from lpq_tf import evaluate as evaluate_module

    qmodel = pm.quantize("tf", cnn, config_for(cnn_capability, "int8", "static"), calib_loader())
    made: list[bytes] = []
    runner = evaluate_module.Runner

    def counted(content: bytes, *args: Any, **kwargs: Any) -> Any:
        made.append(content)
        return runner(content, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "Runner", counted)
    data = calib_loader()
    batch, (fp32_ms, int8_ms) = fidelity._timed(pm, "tf", cnn, qmodel, data, 1)
    assert batch == 1 and fp32_ms and int8_ms
    assert fidelity._TIMING_ROUNDS > 1
    assert len(made) == 2 and made[1] is qmodel.content
