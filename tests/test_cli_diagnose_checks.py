"""`lpq diagnose` refuses to compare models that do not match, and its bar chart shows every
bar (issue 29, items 4 and 9)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from lpq.cli import main
from lpq.diagnose.svg import LOG_SCALE_SPAN, bar_chart, bar_scale


@pytest.fixture(scope="module")
def digits() -> dict[str, Path]:
    from lpq_onnxrt.examples import digits_example

    return {k: Path(v) for k, v in digits_example().items() if k != "metric"}


def _quantize(capsys, model: Path, calib: Path, out: Path) -> Path:
    # latency_aware=false: the small models here are no faster in int8, and an all-float
    # result is an error; these tests need a quantized model to diagnose.
    argv = ["quantize", str(model), "--calib", str(calib), "--out", str(out)]
    assert main([*argv, "--option", "latency_aware=false"]) == 0
    capsys.readouterr()
    return out


def _diagnose(capsys, model: Path, quantized: Path, data: Path, tmp_path: Path):
    code = main(
        ["diagnose", str(model), "--quantized", str(quantized), "--data", str(data),
         "--worst", "1", "--out", str(tmp_path / "report")]
    )  # fmt: skip
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_quantized_model_of_other_weights_is_named_as_not_this_model(capsys, digits, tmp_path):
    model = onnx.load(digits["model"])
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32:
            noise = (rng.normal(size=array.shape) * array.std()).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(noise, init.name))
    other = tmp_path / "other.onnx"
    onnx.save(model, other)
    quantized = _quantize(capsys, other, digits["calib"], tmp_path / "other-q.onnx")
    code, _, err = _diagnose(capsys, digits["model"], quantized, digits["eval"], tmp_path)
    assert code == 2
    assert "the quantized model's weights are not those of" in err
    assert "differ beyond what quantization changes" in err
    assert not (tmp_path / "report").exists()


def test_a_quantized_model_of_another_architecture_is_named_as_not_derived(
    capsys, digits, tmp_path
):
    weight = numpy_helper.from_array(np.ones((64, 10), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="head")],
        "other",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [weight],
    )
    other = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    other.ir_version = 8
    path = tmp_path / "arch.onnx"
    onnx.save(other, path)
    calib = tmp_path / "arch-calib.npz"
    np.savez(calib, x=np.random.default_rng(0).normal(size=(32, 64)).astype(np.float32))
    quantized = _quantize(capsys, path, calib, tmp_path / "arch-q.onnx")
    code, _, err = _diagnose(capsys, digits["model"], quantized, digits["eval"], tmp_path)
    assert code == 2
    assert "is not derived from" in err and "op name of the fp32 model" in err
    assert "shape" not in err.split("hint:")[0]


def test_the_model_it_was_made_from_still_diagnoses(capsys, digits, tmp_path):
    quantized = _quantize(capsys, digits["model"], digits["calib"], tmp_path / "q.onnx")
    code, _out, err = _diagnose(capsys, digits["model"], quantized, digits["eval"], tmp_path)
    assert code == 0, err
    assert (tmp_path / "report" / "diagnosis.html").is_file()


# ------------------------------------------------------------------ item 9: the chart


def _bars(svg: str) -> list[tuple[float, float]]:
    """(value, width) of every bar, read from the SVG itself."""
    found = re.findall(r'<rect class="bar"[^>]* width="([\d.]+)"[^>]* data-value="([^"]+)"', svg)
    return [(float(value), float(width)) for width, value in found]


def test_bars_spanning_decades_are_drawn_on_a_log_scale_without_clipping():
    # the report: 15 bad ops up to 0.102 among 98, the bulk near 0.0002
    values = [0.102 * 0.75**i for i in range(15)] + [0.0002 * (1 + i / 100) for i in range(80)]
    values += [0.0, 0.0, 0.0]
    svg = bar_chart(
        "t", [f"op{i}" for i in range(len(values))], values, value_label="error",
        colours=["#000"] * len(values),
    )  # fmt: skip
    (_, log) = bar_scale(values)
    assert log and "(log scale)" in svg
    bars = _bars(svg)
    assert len(bars) == len(values)
    worst = [w for _, w in bars[:15]]
    # every one of the worst bars has its own width, larger for a larger value
    assert all(a > b + 1 for a, b in itertools.pairwise(worst))
    assert max(w for _, w in bars) == pytest.approx(worst[0])
    plot_width = 640 - 180 - 190
    assert worst[0] <= plot_width + 0.1 and worst[0] > 0.95 * plot_width  # fits, fills
    assert all(w > 0 for v, w in bars if v > 0)  # even the smallest bar shows
    assert all(w == 0 for v, w in bars if v == 0)
    assert "»" not in svg  # nothing clamped


def test_bars_within_one_decade_stay_linear_and_proportional():
    values = [0.9, 0.5, 0.3, 0.1]
    assert max(values) / min(values) < LOG_SCALE_SPAN
    svg = bar_chart("t", list("abcd"), values, value_label="e", colours=["#000"] * 4)
    assert "(log scale)" not in svg
    bars = _bars(svg)
    for (value, width), (ref_value, ref_width) in zip(bars, [bars[0]] * 4):
        assert width / ref_width == pytest.approx(value / ref_value, rel=0.01)
