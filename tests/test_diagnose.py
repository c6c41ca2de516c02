"""`lpq diagnose` (issue 11, item 18): per-op error ranked with op type, precision and
scheme; the output-level effect of falling back each of the worst ops; HTML with charts
and JSON; from a model pair or from a tuning workspace."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import lpq
from lpq.cli import main
from lpq.diagnose import diagnose, write_report


@pytest.fixture
def npq(lpq_plugin, tmp_path: Path, monkeypatch):
    """The numpy adaptor with real int8 rounding (see npq_adaptor.py), for this test."""
    import npq_adaptor

    return npq_adaptor.register_for_test(lpq_plugin, tmp_path, monkeypatch)


def outlier_case(npq):
    """fc1's input has one feature 100x the others: its int8 range crushes the rest, so
    fc1 carries the damage and fc2 (after a ReLU of sane values) very little."""
    rng = np.random.default_rng(0)
    model = npq.NpqModel(
        {
            "w1": rng.normal(0, 0.5, (8, 16)).astype(np.float32),
            "w2": rng.normal(0, 0.5, (16, 4)).astype(np.float32),
        }
    )
    model.weights["w1"][0] = 0.001  # the outlier feature barely matters to the output
    x = rng.normal(size=(96, 8)).astype(np.float32)
    x[:, 0] *= 100
    return model, lpq.ArrayLoader(x, batch_size=32)


def test_the_culprit_ranks_first_and_falling_it_back_removes_most_error(npq, tmp_path):
    model, data = outlier_case(npq)
    result = diagnose(model, data, worst=2)
    assert [op.name for op in result.ops] == ["fc1", "fc2"]
    fc1, fc2 = result.ops
    assert fc1.added_error > 5 * fc2.added_error  # fc2's output error is fc1's, passed on
    assert (fc1.op_type, fc1.precision, fc1.quantized) == ("MatMul", "int8", True)
    assert fc1.scheme == ("static: w int8 sym per_channel minmax; a uint8 asym per_tensor minmax")
    assert fc1.fallback is not None and fc2.fallback is not None
    assert fc1.fallback.gain > 0.8 and fc2.fallback.gain < 0.2
    assert fc1.fallback.output_error < result.output_error
    assert result.config_source.startswith("lpq's default configuration")
    assert "calibrated on the diagnosis data" in result.notes[0]

    html, json_path = write_report(result, tmp_path / "report", worst=2)
    saved = json.loads(json_path.read_text())
    assert [op["name"] for op in saved["ops"]] == ["fc1", "fc2"]
    assert saved["ops"][0]["fallback"]["gain"] == pytest.approx(fc1.fallback.gain)
    page = html.read_text()
    assert page.count("<svg") == 2 + 2, "error bars, fallback bars, one histogram per worst op"
    assert '<td class="text">fc1</td>' in page
    for svg in page.split("<svg")[1:]:  # each chart is well-formed XML
        ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")


def test_a_given_tune_cfg_is_diagnosed_as_is(npq):
    model, data = outlier_case(npq)
    cap = lpq.get_plugin_manager().query_capability("npq", model, data, {})
    cfg = lpq.TuneConfig(
        ops={
            ("fc1", "MatMul"): lpq.OpConfig.fallback(),
            ("fc2", "MatMul"): cap.default_op_config(("fc2", "MatMul")),
        }
    )
    result = diagnose(model, data, tune_cfg=cfg, worst=3, config_source="trial 3")
    by_name = {op.name: op for op in result.ops}
    assert not by_name["fc1"].quantized and by_name["fc1"].scheme == "-"
    assert by_name["fc1"].fallback is None, "only quantized ops are fallen back"
    assert by_name["fc2"].fallback is not None and result.config_source == "trial 3"


@pytest.fixture(scope="module")
def digits() -> dict[str, Path]:
    from lpq_onnxrt.examples import digits_example

    return {k: Path(v) for k, v in digits_example().items() if k != "metric"}


def test_cli_diagnoses_a_quantized_model_file(digits, tmp_path, capsys):
    quantized = tmp_path / "q.onnx"
    # Plain int8 everywhere: latency-aware decisions depend on this machine's timings.
    assert main(["quantize", str(digits["model"]), "--calib", str(digits["calib"]),
                 "--no-latency-aware", "--out", str(quantized)]) == 0  # fmt: skip
    code = main(
        [
            "diagnose",
            str(digits["model"]),
            "--quantized",
            str(quantized),
            "--data",
            str(digits["eval"]),
            "--calib",
            str(digits["calib"]),
            "--worst",
            "2",
            "--batches",
            "2",
            "--out",
            str(tmp_path / "d"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "model output: relative error" in out and "top-1 agreement" in out
    report = json.loads((tmp_path / "d" / "diagnosis.json").read_text())
    assert report["quantized"] == str(quantized)
    assert report["config_source"].startswith("read from the quantized model")
    assert {op["op_type"] for op in report["ops"]} >= {"Conv", "MatMul"}
    assert all(op["precision"] == "int8" for op in report["ops"])  # read from the model
    errors = [op["added_error"] for op in report["ops"]]
    assert errors == sorted(errors, reverse=True)
    assert sum(op["fallback"] is not None for op in report["ops"]) == 2
    # scored with the gate's metric (class scores: top-1 agreement), the fallbacks from
    # the re-quantized model, whose fidelity is said beside the given model's
    assert report["metric"] == "agreement" and 0.0 <= report["fidelity"] <= 1.0
    assert all(op["fallback"]["fidelity"] is not None for op in report["ops"] if op["fallback"])
    base = report["fallback_base_fidelity"]
    assert base is not None and f"agreement {base:.4f}" in " ".join(report["notes"])
    assert (tmp_path / "d" / "diagnosis.html").read_text().startswith("<!DOCTYPE html>")


def test_cli_diagnoses_a_tuning_workspace(digits, tmp_path, capsys):
    workspace = tmp_path / "ws"
    tune = ["tune", str(digits["model"]), "--calib", str(digits["calib"])]
    tune += ["--eval", str(digits["eval"]), "--workspace", str(workspace), "--max-trials", "1"]
    assert main([*tune, "--out", str(tmp_path / "tuned.onnx")]) == 0
    capsys.readouterr()
    code = main(
        [
            "diagnose",
            "--workspace",
            str(workspace),
            "--data",
            str(digits["eval"]),
            "--worst",
            "1",
            "--batches",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    report_file = next(workspace.glob("*/diagnosis/diagnosis.json"))
    report = json.loads(report_file.read_text())
    assert report["config_source"].startswith("trial 0, the configuration chosen by the run")
    assert report["quantized"] == str(tmp_path / "tuned.onnx")
    assert report["model"] == str(digits["model"])


def test_a_workspace_without_a_finished_run_is_a_clear_error(tmp_path, capsys):
    run = tmp_path / "ws" / "abc"
    run.mkdir(parents=True)
    (run / "history.json").write_text(json.dumps({"framework": "onnxrt", "trials": []}))
    code = main(["diagnose", "--workspace", str(tmp_path / "ws"), "--data", "x.npz"])
    err = capsys.readouterr().err
    assert code == 2 and "has no chosen trial" in err
