"""The tuner end to end on a Keras model: ``lpq tune`` on a .keras file and ``lpq.fit``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tf_testmodels import calib_loader, digits, eval_loader, top1

import lpq

pm = lpq.get_plugin_manager()


def test_cli_tune_on_a_keras_file(cnn: Any, cnn_fp32_accuracy: float, tmp_path: Path) -> None:
    from lpq.cli import main

    cnn.save(tmp_path / "digits.keras")
    x_train, _ = digits("train")
    x_eval, y_eval = digits("eval")
    np.savez(tmp_path / "calib.npz", images=x_train[:200])
    np.savez(tmp_path / "eval.npz", images=x_eval, labels=y_eval)
    code = main(
        ["tune", str(tmp_path / "digits.keras"), "--calib", str(tmp_path / "calib.npz"),
         "--eval", str(tmp_path / "eval.npz"), "--metric", "top1", "--tolerable-loss", "0.01",
         "--max-trials", "6", "--workspace", str(tmp_path / "ws"),
         "--out", str(tmp_path / "digits-int8.tflite")]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(next((tmp_path / "ws").rglob("summary.json")).read_text())
    assert summary["framework"] == "tf"
    assert summary["goal_met"] is True
    qmodel = pm.load_model("tf", tmp_path / "digits-int8.tflite")
    found = pm.quantized_ops("tf", qmodel)
    assert "int8" in found.values()
    assert summary["quantized_ops"] == sum(p != "fp32" for p in found.values())
    assert top1(qmodel) >= cnn_fp32_accuracy * 0.99


def test_fit_on_a_keras_model_meets_the_goal_and_resumes(cnn: Any, tmp_path: Path) -> None:
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=6),
    )
    result = lpq.fit(cnn, conf, calib_loader(), eval_dataloader=eval_loader(), workspace=tmp_path)
    assert result.framework == "tf"
    assert result.goal_met
    assert result.baseline.accuracy > 0.9
    assert result.best.accuracy >= result.baseline.accuracy * 0.99
    assert result.best.quantized_ops >= 2
    saved = result.save(tmp_path / "digits-int8")
    assert saved.suffix == ".tflite" and saved.exists()
    again = lpq.fit(cnn, conf, calib_loader(), eval_dataloader=eval_loader(), workspace=tmp_path)
    assert all(trial.resumed for trial in again.trials)


def test_cli_bad_model_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "calib.npz").write_bytes(b"")
    (tmp_path / "notes.tflite").write_text("not a model")
    result = subprocess.run(
        [sys.executable, "-m", "lpq", "quantize", str(tmp_path / "notes.tflite"),
         "--framework", "tf", "--approach", "dynamic", "--out", str(tmp_path / "out.tflite")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "not a TensorFlow model" in result.stderr + result.stdout
