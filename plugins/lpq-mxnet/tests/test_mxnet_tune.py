"""Tuning end to end: ``lpq tune`` on an exported model, and ``lpq.fit`` on a block.

Both use the ``modelsize`` objective: with ``performance`` a candidate that times slower
than fp32 misses the goal, and this sub-millisecond model's timings on a busy CI machine
would make that verdict, not the adaptor, decide the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

import lpq


def test_cli_tunes_an_exported_model(
    exported: Path, digits: dict[str, np.ndarray], tmp_path: Path, pm: Any, top1: Any
) -> None:
    from lpq.cli import main

    np.savez(tmp_path / "calib.npz", data=digits["train_x"][:200])
    np.savez(tmp_path / "eval.npz", data=digits["test_x"], labels=digits["test_y"])
    symbol = exported.with_name(exported.name + "-symbol.json")
    out = tmp_path / "digits-int8"
    code = main(
        ["tune", str(symbol), "--calib", str(tmp_path / "calib.npz"),
         "--eval", str(tmp_path / "eval.npz"), "--metric", "top1", "--tolerable-loss", "0.01",
         "--workspace", str(tmp_path / "ws"), "--out", str(out), "--max-trials", "5",
         "--objective", "modelsize"]
    )  # fmt: skip
    assert code == 0
    summaries = list((tmp_path / "ws").rglob("summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    assert summary["goal_met"] is True
    written = {p.name for p in tmp_path.iterdir() if p.name.startswith("digits-int8")}
    assert written == {"digits-int8-symbol.json", "digits-int8-0000.params", "digits-int8-lpq.json"}
    qmodel = pm.load_model("mxnet", out.with_name("digits-int8-symbol.json"))
    found = pm.quantized_ops("mxnet", qmodel)
    assert "int8" in found.values()
    data = lpq.ArrayLoader(digits["test_x"], digits["test_y"], 100)
    fp32 = pm.evaluate("mxnet", exported, data, [top1]).accuracy
    assert pm.evaluate("mxnet", qmodel, data, [top1]).accuracy >= fp32 * 0.99


def test_fit_tunes_a_gluon_block(
    digits_cnn: Any, digits: dict[str, np.ndarray], tmp_path: Path, pm: Any
) -> None:
    conf = lpq.PostTrainingQuantConfig(
        calibration_sampling_size=200,
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=5, objective="modelsize"),
    )
    result = lpq.fit(
        digits_cnn,
        conf,
        calib_dataloader=digits["train_x"][:200],
        eval_dataloader=(digits["test_x"], digits["test_y"]),
        eval_metric="top1",
        workspace=tmp_path / "ws",
    )
    summary = result.summary()
    assert summary["goal_met"] is True
    assert summary["final_accuracy"] >= summary["baseline_accuracy"] * 0.99
    assert "int8" in pm.quantized_ops("mxnet", result.model).values()
    written = Path(result.save(tmp_path / "best"))
    assert written.name == "best-symbol.json" and written.is_file()
