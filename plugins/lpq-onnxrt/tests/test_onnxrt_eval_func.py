"""``eval_func`` users run what they receive with ``lpq_onnxrt.inference_session``: the fp32
model as given (a path) and each trial's quantized model (in memory)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

import lpq
import lpq_onnxrt
from lpq_onnxrt.qmodel import QuantizedModel


def test_eval_func_runs_the_fp32_path_and_every_quantized_trial(digits, calib_loader, tmp_path):
    x, y = digits["eval_x"][:200], digits["eval_y"][:200]
    seen: list[tuple[str, np.ndarray]] = []

    def eval_func(model: Any) -> float:
        session = lpq_onnxrt.inference_session(model)
        name = session.get_inputs()[0].name
        logits = session.run(None, {name: x})[0]
        kind = "quantized" if isinstance(model, QuantizedModel) else type(model).__name__
        seen.append((kind, logits))
        return float((logits.argmax(axis=1) == y).mean())

    conf = lpq.PostTrainingQuantConfig(
        latency_aware=False,
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.02),
        tuning_criterion=lpq.TuningCriterion(max_trials=3),
    )
    result = lpq.fit(
        digits["model"], conf, calib_loader, eval_func=eval_func, workspace=tmp_path / "ws"
    )
    kinds = [kind for kind, _ in seen]
    assert kinds[0] in {"str", "PosixPath"} and "quantized" in kinds  # fp32 as given
    fp32 = seen[0][1]
    quantized = next(logits for kind, logits in seen if kind == "quantized")
    # the session ran the int8 model, not the fp32 one again
    assert not np.allclose(quantized, fp32)
    assert np.abs(quantized - fp32).max() < 0.25 * np.abs(fp32).max()
    assert result.goal_met
    saved = onnx.load(str(result.save(tmp_path / "tuned.onnx")))
    assert any(node.op_type in {"QuantizeLinear", "QLinearConv"} for node in saved.graph.node)
