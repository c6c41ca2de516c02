"""One trial result: an adaptor whose quantize returns :class:`lpq.QuantizeResult` (the
model, its per-op precisions, its resolved config, its size) is asked no further hook for
them; a bare model still works, and every caller of ``pm.quantize`` gets the bare model."""

from __future__ import annotations

from typing import Any

import numpy as np

import lpq
from lpq.api import fit
from lpq.config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion
from lpq.testing.fake_adaptor import FRAMEWORK, FakeAdaptorPlugin, FakeModel, FakeQuantizedModel

EVAL = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
CALIB = [np.zeros((100, 1), np.float32)]


class Counting(FakeAdaptorPlugin):
    """Counts the per-trial hooks a QuantizeResult makes unnecessary."""

    report = True

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func) -> Any:
        if framework != FRAMEWORK:
            return None
        self._count("quantize")
        quantized = FakeQuantizedModel(model, tune_cfg)
        if not self.report:
            return quantized
        ops = {
            name: ("int8" if cfg.quantized else "fp32") for (name, _), cfg in tune_cfg.ops.items()
        }
        return lpq.QuantizeResult(quantized, quantized_ops=ops, size_bytes=1234)

    @lpq.hookimpl
    def lpq_quantized_ops(self, framework, model) -> dict[str, str] | None:
        if framework != FRAMEWORK:
            return None
        self._count("quantized_ops")
        return {name: "int8" for name, _ in model.source.ops}


def _fit(tmp_path):
    conf = PostTrainingQuantConfig(
        accuracy_criterion=AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=TuningCriterion(max_trials=3, objective="modelsize"),
    )
    model = FakeModel(ops=[("a", "Conv"), ("b", "MatMul")], sensitivity={"a": 0.05})
    return fit(model, conf, CALIB, eval_dataloader=EVAL, workspace=tmp_path / "ws")


def test_a_quantize_result_answers_the_trial_without_more_hook_calls(lpq_plugin, tmp_path):
    plugin = Counting(tmp_path)
    lpq_plugin(plugin, name="fake")
    result = _fit(tmp_path)
    assert plugin.calls.get("quantized_ops", 0) == 0
    assert all(t.counts_from == "model" for t in result.trials if t.status == "ok")
    assert {t.size_bytes for t in result.trials if t.status == "ok"} == {1234}


def test_a_bare_model_is_still_asked_through_the_hooks(lpq_plugin, tmp_path):
    plugin = Counting(tmp_path)
    plugin.report = False
    lpq_plugin(plugin, name="fake")
    result = _fit(tmp_path)
    assert plugin.calls["quantized_ops"] >= len([t for t in result.trials if t.status == "ok"])


def test_callers_of_quantize_get_the_bare_model(lpq_plugin, tmp_path):
    pm = lpq_plugin(Counting(tmp_path), name="fake")
    model = FakeModel(ops=[("a", "Conv")])
    cfg = lpq.TuneConfig()
    assert isinstance(pm.quantize(FRAMEWORK, model, cfg, CALIB), FakeQuantizedModel)
    assert isinstance(pm.quantize_result(FRAMEWORK, model, cfg, CALIB), lpq.QuantizeResult)


class Resolving(Counting):
    """Reports the configuration its model really is: every op asked quantized kept fp32
    (an adaptor rule's fallbacks), through QuantizeResult or through the hook."""

    through_hook = False

    @staticmethod
    def really(tune_cfg: lpq.TuneConfig) -> lpq.TuneConfig:
        return tune_cfg.with_ops({key: lpq.OpConfig.fallback() for key in tune_cfg.ops})

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func) -> Any:
        if framework != FRAMEWORK:
            return None
        quantized = FakeQuantizedModel(model, tune_cfg)
        if self.through_hook:
            return quantized
        return lpq.QuantizeResult(quantized, tune_cfg=self.really(tune_cfg))

    @lpq.hookimpl
    def lpq_resolved_config(self, framework, model) -> lpq.TuneConfig | None:
        if framework != FRAMEWORK or not self.through_hook:
            return None
        return self.really(model.tune_cfg)


def _quantized_cfg(plugin: Counting, lpq_plugin: Any) -> tuple[lpq.TuneConfig, lpq.TuneConfig]:
    """What lpq.quantize returned, and the configuration it asked the adaptor for (which
    it also returns as ``requested_tune_cfg`` where the two differ)."""
    lpq_plugin(plugin, name="fake")
    model = FakeModel(ops=[("a", "Conv"), ("b", "MatMul")])
    result = lpq.quantize(model, PostTrainingQuantConfig(framework=FRAMEWORK), CALIB)
    asked = result.model.tune_cfg
    assert result.requested_tune_cfg == (asked if result.tune_cfg != asked else None)
    return result.tune_cfg, asked


def test_quantize_returns_the_configuration_the_adaptor_says_its_model_is(lpq_plugin, tmp_path):
    returned, asked = _quantized_cfg(Resolving(tmp_path), lpq_plugin)
    assert asked.quantized_ops()  # the default plan asked for int8 ops
    assert not returned.quantized_ops() and returned == Resolving.really(asked)


def test_quantize_asks_the_resolved_config_hook_for_a_bare_model(lpq_plugin, tmp_path):
    plugin = Resolving(tmp_path)
    plugin.through_hook = True
    returned, asked = _quantized_cfg(plugin, lpq_plugin)
    assert returned == Resolving.really(asked) and returned != asked


def test_quantize_returns_the_asked_configuration_when_the_adaptor_says_nothing(
    lpq_plugin, tmp_path
):
    plugin = Counting(tmp_path)
    plugin.report = False
    returned, asked = _quantized_cfg(plugin, lpq_plugin)
    assert returned == asked
