"""Honest tuning verdicts and limits (the trust issue, item 5), on the scripted fake adaptor:
"accuracy met, nothing faster" is not "accuracy goal not met"; no trial is spent on recipes
added to a config whose converted model quantized nothing; ``--timeout`` is a limit."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lpq import hookimpl
from lpq.api import VERDICT_ACCURATE_NOT_FASTER, VERDICT_MET, VERDICT_NOT_MET, fit
from lpq.config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion
from lpq.testing.fake_adaptor import (
    CAPABILITY_YAML,
    FRAMEWORK,
    FakeAdaptorPlugin,
    FakeModel,
    FakeQuantizedModel,
)

EVAL = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
CALIB = [np.zeros((100, 1), np.float32)]
RECIPES_YAML = CAPABILITY_YAML.replace(
    "  precisions:", "  recipes:\n    bias_correction: [false, true]\n    smooth: [false, 0.5]\n"
    "  precisions:"
)


class ConvertsNothing(FakeAdaptorPlugin):
    """An adaptor whose converted models run every op in float (as lpq-onnxrt's latency
    step leaves a model where no int8 op pays): accurate, but nothing was quantized."""

    @hookimpl
    def lpq_quantized_ops(self, framework: str, model: Any) -> dict[str, str] | None:
        if framework != FRAMEWORK or not isinstance(model, FakeQuantizedModel):
            return None
        return {name: "fp32" for name, _ in model.source.ops}


class SlowQuantize(FakeAdaptorPlugin):
    """Each quantization takes ``seconds``."""

    seconds = 0.4

    @hookimpl
    def lpq_quantize(self, framework: str, model: Any, tune_cfg: Any, calib_dataloader: Any,
                     train_func: Any) -> Any:
        if framework != FRAMEWORK:
            return None
        time.sleep(self.seconds)
        return FakeQuantizedModel(model, tune_cfg)


def _conf(**tuning: Any) -> PostTrainingQuantConfig:
    return PostTrainingQuantConfig(
        accuracy_criterion=AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=TuningCriterion(**tuning),
    )


def _fit(model: FakeModel, tmp_path: Path, **tuning: Any) -> Any:
    return fit(model, _conf(**tuning), CALIB, eval_dataloader=EVAL, workspace=tmp_path / "ws")


def _harmless() -> FakeModel:
    return FakeModel(ops=[("a", "Conv"), ("b", "MatMul"), ("c", "Conv")], sensitivity={})


def test_a_reachable_goal_says_goal_met(lpq_plugin, tmp_path):
    lpq_plugin(FakeAdaptorPlugin(tmp_path), name="fake")
    result = _fit(_harmless(), tmp_path)
    assert result.goal_met
    assert result.summary()["verdict"] == VERDICT_MET


def test_accurate_but_nothing_quantized_is_not_reported_as_accuracy_lost(lpq_plugin, tmp_path):
    lpq_plugin(ConvertsNothing(tmp_path), name="fake")
    result = _fit(_harmless(), tmp_path, max_trials=6)
    summary = result.summary()
    assert not result.goal_met
    assert summary["verdict"] == VERDICT_ACCURATE_NOT_FASTER
    assert "accuracy goal met" in summary["stop_reason"]
    assert "no configuration met the accuracy goal" not in summary["stop_reason"]


def test_an_unreachable_goal_says_not_met(lpq_plugin, tmp_path):
    lpq_plugin(FakeAdaptorPlugin(tmp_path), name="fake")
    model = FakeModel(
        ops=[("a", "Conv"), ("b", "MatMul")], sensitivity={"a": 0.2, "b": 0.2}
    )
    result = _fit(model, tmp_path, max_trials=4)
    assert result.summary()["verdict"] == VERDICT_NOT_MET


def test_no_trial_adds_recipes_to_a_config_that_converted_to_nothing(lpq_plugin, tmp_path):
    plugin = ConvertsNothing(tmp_path)
    plugin.capability_file.write_text(RECIPES_YAML)
    lpq_plugin(plugin, name="fake")
    result = _fit(_harmless(), tmp_path, max_trials=20)
    empty = [t for t in result.trials if t.status == "ok" and t.quantized_ops == 0]
    assert empty, "the adaptor converts every config to a model with nothing quantized"
    first = empty[0].config()
    recipes_on_top = [
        t.config().options
        for t in result.trials[1:]
        if t.config().ops == first.ops and t.config().options != first.options
    ]
    assert recipes_on_top == []


def test_the_planted_check_would_see_recipe_trials(lpq_plugin, tmp_path):
    """The adaptor above does offer recipes to try: without the rule they would run."""
    plugin = FakeAdaptorPlugin(tmp_path)
    plugin.capability_file.write_text(RECIPES_YAML)
    lpq_plugin(plugin, name="fake")
    model = FakeModel(ops=[("a", "Conv"), ("b", "MatMul")], sensitivity={"a": 0.2, "b": 0.2})
    result = _fit(model, tmp_path, max_trials=20)
    assert any(t.config().options.get("bias_correction") for t in result.trials)


@pytest.mark.parametrize("timeout", [1.0])
def test_timeout_starts_no_trial_that_cannot_finish(lpq_plugin, tmp_path, timeout):
    lpq_plugin(SlowQuantize(tmp_path), name="fake")
    model = FakeModel(
        ops=[(f"op{i}", "Conv") for i in range(8)], sensitivity={f"op{i}": 0.004 for i in range(8)}
    )
    started = time.monotonic()
    result = _fit(model, tmp_path, max_trials=50, timeout=timeout)
    elapsed = time.monotonic() - started
    assert "would not finish inside the limit" in result.stop_reason
    # the fp32 pass and the final side-by-side timing come on top; trials stop in time
    run_trials = [t for t in result.trials if t.status == "ok"]
    assert sum(t.duration_s for t in run_trials) <= timeout + SlowQuantize.seconds
    assert elapsed < 30


class StuckAfterDefault(FakeAdaptorPlugin):
    """The default config quantizes at once; any config with an op fallen back takes a
    minute (a trial that hits a slow path long after the limit)."""

    stuck_s = 60.0

    @hookimpl
    def lpq_quantize(self, framework: str, model: Any, tune_cfg: Any, calib_dataloader: Any,
                     train_func: Any) -> Any:
        if framework != FRAMEWORK:
            return None
        if len(tune_cfg.quantized_ops()) < len(model.ops):
            time.sleep(self.stuck_s)
        return FakeQuantizedModel(model, tune_cfg)


@pytest.mark.parametrize("executor", ["serial", "process"])
def test_timeout_stops_a_running_trial_at_the_limit(lpq_plugin, tmp_path, executor):
    plugin = StuckAfterDefault(tmp_path)
    lpq_plugin(plugin, name="fake")
    # op "a" ruins accuracy: the default misses the goal and the next trials fall ops back
    model = FakeModel(ops=[("a", "Conv"), ("b", "MatMul")], sensitivity={"a": 0.3})
    started = time.monotonic()
    result = _fit(model, tmp_path, max_trials=10, timeout=3.0, workers=2, executor=executor)
    elapsed = time.monotonic() - started
    assert elapsed < StuckAfterDefault.stuck_s / 2, "the stuck trial ran to its end"
    assert "stopped at the limit" in result.stop_reason
    # what finished is kept (configs with every op int8), the stopped trials (an op
    # fallen back: they hang) are not recorded
    assert result.trials and all(t.status == "ok" for t in result.trials)
    assert all(len(t.config().quantized_ops()) == 2 for t in result.trials)
    # a re-run without the limit (and no longer stuck) resumes: what finished is replayed,
    # the trials stopped before run now and reach the goal
    plugin.stuck_s = 0
    again = _fit(model, tmp_path, max_trials=10, timeout=0, workers=2, executor=executor)
    assert again.goal_met
    replayed = {t.fingerprint for t in again.trials if t.resumed}
    assert {t.fingerprint for t in result.trials} <= replayed
