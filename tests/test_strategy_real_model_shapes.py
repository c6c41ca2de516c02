"""The default strategy on damage shaped like real models (issue: a published classifier
whose per-op error ranking misled the search; damage concentrated in one op type).

The fake adaptor scripts each op's accuracy cost; a decoy adaptor makes inspection lie
the way real activations can (large activation error where the output does not care).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lpq
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel, FakeQuantizedModel

EVAL = [(np.zeros((1000, 1), np.float32), np.arange(1000) % 10)]
CALIB = [np.zeros((100, 1), np.float32)]


def fit(model: FakeModel, workspace: Path, strategy: str = "auto", **tuning):
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(strategy=strategy, max_trials=20, **tuning),
    )
    return lpq.fit(model, conf, CALIB, eval_dataloader=EVAL, workspace=workspace)


def fallen(result: lpq.TuningResult) -> set[str]:
    return {name for (name, _), c in result.tune_cfg.ops.items() if not c.quantized}


def test_damage_spread_over_one_op_type_is_found_by_the_op_type_stage(lpq_plugin, tmp_path):
    lpq_plugin(FakeAdaptorPlugin(tmp_path), name="fake")
    ops = [(f"conv{i}", "Conv") for i in range(16)] + [(f"mm{i}", "MatMul") for i in range(8)]
    # No single MatMul stands out, but together they cost 4x the tolerance.
    cost = {f"conv{i}": 0.0001 for i in range(16)} | {f"mm{i}": 0.0045 for i in range(8)}
    result = fit(FakeModel(ops=ops, sensitivity=cost), tmp_path / "ws")
    assert result.goal_met
    assert len(result.trials) <= 8
    assert {name for name in fallen(result)} <= {f"mm{i}" for i in range(8)}
    assert result.best.quantized_ops >= 16


class DecoyInspection(FakeAdaptorPlugin):
    """Inspection reports the largest activation error on ``decoys`` (which cost the
    output nothing) and almost none on the real culprit."""

    decoys = ("op1", "op2", "op3", "op4", "op5")

    @lpq.hookimpl
    def lpq_inspect_tensor(self, framework, model, dataloader, op_names, kind, iteration):
        if framework != "fake":
            return None
        source = model.source if isinstance(model, FakeQuantizedModel) else model
        activations = {}
        for name, _ in source.ops:
            value = np.ones((2, 4), np.float32)
            quantized = isinstance(model, FakeQuantizedModel) and (
                model.tune_cfg.ops[(name, dict(source.ops)[name])].quantized
            )
            if quantized and name in self.decoys:
                value[:, 0] += 1.0 + 0.1 * int(name[2:])
            activations[name] = [value]
        return lpq.Inspection(activations=activations)


def misleading_model() -> FakeModel:
    ops = [(f"op{i}", "Conv") for i in range(20)]
    cost = {f"op{i}": 0.0001 for i in range(20)}
    cost["op15"] = 0.03  # the culprit: invisible to inspection
    return FakeModel(ops=ops, sensitivity=cost)


def test_misleading_per_op_error_does_not_mislead_the_default_strategy(lpq_plugin, tmp_path):
    lpq_plugin(DecoyInspection(tmp_path), name="fake")
    result = fit(misleading_model(), tmp_path / "auto")
    assert result.goal_met, [(t.stage, t.accuracy) for t in result.trials]
    assert len(result.trials) <= 20
    assert "op15" in fallen(result)
    assert not fallen(result) & set(DecoyInspection.decoys), "decoys must stay quantized"
    assert result.best.quantized_ops >= 15


def test_pure_error_ranking_is_misled_by_the_same_model(lpq_plugin, tmp_path):
    """The contrast that makes the test above meaningful: ``mse`` trusts inspection."""
    lpq_plugin(DecoyInspection(tmp_path), name="fake")
    result = fit(misleading_model(), tmp_path / "mse", strategy="mse")
    assert fallen(result) & set(DecoyInspection.decoys)


@pytest.mark.parametrize("workers", [1, 2])
def test_growing_fallback_that_hurts_is_backed_out(lpq_plugin, tmp_path, workers):
    """Falling back two ops together may *lower* accuracy although each alone helps (a
    float island between int8 neighbours adds requantization error). The combination is
    backed out, the op kept quantized, and the search goes on to the next op."""

    class Requantization(FakeAdaptorPlugin):
        @lpq.hookimpl
        def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
            if framework != "fake":
                return None
            quantized = FakeQuantizedModel(model, tune_cfg)
            if not (
                tune_cfg.ops[("op7", "Conv")].quantized or tune_cfg.ops[("op5", "Conv")].quantized
            ):
                penalty = {**model.sensitivity, "op8": 0.02}
                quantized.source = FakeModel(ops=model.ops, sensitivity=penalty)
            return quantized

    lpq_plugin(Requantization(tmp_path), name="fake")
    ops = [(f"op{i}", "Conv") for i in range(12)]
    cost = {f"op{i}": 0.0002 for i in range(12)} | {"op3": 0.006, "op7": 0.006, "op5": 0.006}
    result = fit(
        FakeModel(ops=ops, sensitivity=cost), tmp_path / "ws", workers=workers, executor="auto"
    )
    assert result.goal_met
    assert not {"op5", "op7"} <= fallen(result)
    both = [t for t in result.trials if {"op5", "op7"} <= fallen_in(t)]
    assert both, "the harmful combination was never tried: the test proves nothing"
    assert all(not t.meets_goal for t in both)


def fallen_in(trial: lpq.TrialRecord) -> set[str]:
    cfg = trial.config()
    assert cfg is not None
    return {name for (name, _), c in cfg.ops.items() if not c.quantized}
