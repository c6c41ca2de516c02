"""``lpq quantize``'s fidelity gate (the trust issue, item 2): the quantized model is scored
against fp32 on held-out samples with a task metric, fidelity is printed beside speed and
size, a low one is said plainly, ``--min-fidelity`` makes it an error with nothing written,
and a model that quantized nothing is never written with exit 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lpq.cli import main
from lpq.eval.data import ArrayLoader
from lpq.eval.fidelity import split_held_out


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def _save(model, path: Path) -> Path:
    import onnx

    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def outlier_classifier(tmp_path: Path) -> tuple[Path, Path]:
    """A classifier whose decision rests on small input features beside one huge feature:
    per-tensor int8 activations round the small ones away, so top-1 agreement with fp32
    collapses whatever the CPU (a planted fidelity loss, like a saturating Gemm's)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    features, classes = 16, 8
    weight = rng.normal(0, 1, (features, classes)).astype(np.float32)
    weight[0] = 0.05  # the huge feature shifts every class alike: it never decides
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="head")],
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = _save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        tmp_path / "outlier.onnx",
    )
    x = rng.normal(0, 0.01, (200, features)).astype(np.float32)
    x[:, 0] = 1000.0
    data = tmp_path / "calib.npz"
    np.savez(data, x=x)
    return model, data


def test_held_out_samples_are_split_off_the_end_and_never_overlap():
    loader = ArrayLoader({"x": np.arange(10, dtype=np.float32)[:, None]}, batch_size=4)
    calib, held = split_held_out(loader)
    assert (calib.num_samples, held.num_samples) == (8, 2)
    assert float(held.inputs["x"][0, 0]) == 8.0  # the last two samples
    with pytest.raises(Exception, match="one sample"):
        split_held_out(ArrayLoader({"x": np.zeros((1, 1), np.float32)}))


def test_fidelity_is_printed_beside_speed_on_held_out_samples(capsys, tmp_path):
    from lpq_onnxrt.examples import digits_example

    files = digits_example()
    out = tmp_path / "q.onnx"
    code, text = _run(
        capsys, "quantize", str(files["model"]), "--calib", str(files["calib"]), "--out", str(out)
    )
    assert code == 0, text
    assert "fidelity" in text and "against fp32 on the last 40 of 200 --calib samples" in text
    assert "x fp32 speed" in text
    assert out.exists()


def test_a_planted_fidelity_loss_is_said_plainly(capsys, outlier_classifier, tmp_path):
    model, data = outlier_classifier
    out = tmp_path / "q.onnx"
    # latency_aware=false: one small MatMul is not faster in int8, and the gate is the point
    code, text = _run(
        capsys,
        "quantize",
        str(model),
        "--calib",
        str(data),
        "--out",
        str(out),
        "--option",
        "latency_aware=false",
    )
    assert code == 0, text
    assert "warning: fidelity" in text and "is below 0.95" in text
    assert out.exists()


def test_min_fidelity_makes_a_loss_an_error_and_writes_nothing(
    capsys, outlier_classifier, tmp_path
):
    model, data = outlier_classifier
    out = tmp_path / "q.onnx"
    code, text = _run(
        capsys,
        "quantize",
        str(model),
        "--calib",
        str(data),
        "--out",
        str(out),
        "--min-fidelity",
        "0.9",
        "--option",
        "latency_aware=false",
    )
    assert code != 0
    assert "below --min-fidelity 0.9: nothing written" in text
    assert "Traceback" not in text
    assert not out.exists()


def test_a_model_that_quantized_nothing_is_not_written(capsys, tmp_path):
    """Every op the plan quantizes is left in float by the adaptor: an error, exit non-zero."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(rng.normal(0, 1, (4, 3)).astype(np.float32), "w")],
    )
    model = _save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx"
    )
    data = tmp_path / "calib.npz"
    np.savez(data, x=rng.normal(0, 1, (20, 4)).astype(np.float32))
    out = tmp_path / "q.onnx"
    # Excluding the one op keeps it in float: the converted model quantizes nothing.
    code, text = _run(
        capsys,
        "quantize",
        str(model),
        "--calib",
        str(data),
        "--out",
        str(out),
        "--exclude-op-name",
        "mm",
    )
    assert code != 0, text
    assert "nothing written" in text
    assert not out.exists()


def test_quantize_prints_its_stages_when_piped(tmp_path):
    """Piped output (CI logs, `| tee`) shows the stages as they happen, lpq's and the
    adaptor's, each once."""
    import subprocess
    import sys

    from lpq_onnxrt.examples import digits_example

    files = digits_example()
    argv = [sys.executable, "-m", "lpq", "quantize", str(files["model"])]
    argv += ["--calib", str(files["calib"]), "--out", str(tmp_path / "q.onnx")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "lpq: quantizing..."
    assert any(line.startswith("calibrating ") for line in lines)  # the adaptor's stage
    assert not any(line.startswith("INFO:") for line in lines), "each stage printed once"
    assert lines.index("lpq: quantizing...") < next(
        i for i, line in enumerate(lines) if line.startswith("quantized ")
    )


@pytest.mark.parametrize(
    ("fp32_ms", "quantized_ms", "warned"), [(9.0, 10.0, True), (10.0, 8.0, False)]
)
def test_a_written_model_slower_than_fp32_is_said_plainly(tmp_path, fp32_ms, quantized_ms, warned):
    """The fidelity check's timing is printed as "x fp32 speed"; under 0.95 of fp32 the
    user is told in a warning line, not left to read a ratio."""
    import io

    from rich.console import Console

    from lpq.cli.tuning import _print_fidelity
    from lpq.eval.fidelity import Fidelity

    model, written = tmp_path / "m.onnx", tmp_path / "q.onnx"
    model.write_bytes(b"0" * 400)
    written.write_bytes(b"0" * 100)
    fidelity = Fidelity("agreement", 1.0, "class scores", 4, "held out", fp32_ms, quantized_ms, 1)
    stream = io.StringIO()
    _print_fidelity(Console(file=stream, width=300), fidelity, str(model), written)
    text = stream.getvalue()
    assert f"{fp32_ms / quantized_ms:.2f}x fp32 speed (batch 1)" in text
    assert ("slower than fp32 in this check" in text) is warned


def _fidelity(text: str) -> float:
    import re

    found = re.search(r"fidelity (\d\.\d+) \(", text)
    assert found, text
    return float(found.group(1))


def test_metric_options_reach_the_named_metric(capsys, outlier_classifier, tmp_path):
    """--metric-option sets the metric's own options: the planted loss reads low as top-1
    agreement, and 1.0 where the fp32 top-1 only has to be among all 8 classes."""
    model, data = outlier_classifier
    common = ["--calib", str(data), "--option", "latency_aware=false", "--force"]
    out = str(tmp_path / "q.onnx")
    code, top1 = _run(
        capsys, "quantize", str(model), *common, "--out", out, "--metric", "top1_agreement"
    )
    assert code == 0, top1
    code, all8 = _run(
        capsys, "quantize", str(model), *common, "--out", out,
        "--metric", "top1_agreement", "--metric-option", "k=8",
    )  # fmt: skip
    assert code == 0, all8
    assert _fidelity(top1) < 0.95 and _fidelity(all8) == 1.0
    assert "named with --metric (k=8)" in all8


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--metric-option", "score_threshold=0.5"], "--metric-option needs --metric"),
        (
            ["--metric", "detection_f1", "--metric-option", "score=0.5"],
            "metric detection_f1 has no option score",
        ),
    ],
)
def test_a_wrong_metric_option_is_refused_before_any_work(
    capsys, outlier_classifier, tmp_path, argv, said
):
    model, data = outlier_classifier
    out = tmp_path / "q.onnx"
    code, text = _run(
        capsys, "quantize", str(model), "--calib", str(data), "--out", str(out), *argv
    )
    assert code != 0 and said in text
    assert "quantizing" not in text and not out.exists()
    if "score=0.5" in argv:
        assert "score_threshold=0.25" in text  # the hint lists the options it takes
