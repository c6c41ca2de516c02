"""An adaptor that resolves a choice the tune_cfg left open (``lpq_resolved_config``): a
later proposal of what it resolved to is answered from that trial, not run again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from core_testutil import fit_fake

import lpq
from lpq.testing.fake_adaptor import (
    CAPABILITY_YAML,
    FakeAdaptorPlugin,
    FakeModel,
    FakeQuantizedModel,
)

#: The fake capability with an ``auto`` range algorithm first (the default).
AUTO_YAML = CAPABILITY_YAML.replace("algorithm: [minmax, kl]", "algorithm: [auto, minmax, kl]")


class ResolvesAuto(FakeAdaptorPlugin):
    """Quantizes ``auto`` as ``kl`` (what an adaptor's own choice found best) and says so
    through ``lpq_resolved_config`` unless ``tells`` is False."""

    def __init__(self, folder: Path, tells: bool = True) -> None:
        super().__init__(folder)
        self.capability_file.write_text(AUTO_YAML)
        self.tells = tells
        self.quantized: list[str] = []

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None
        self._count("quantize")
        ops = {
            key: replace(cfg, activation=replace(cfg.activation, algorithm="kl"))
            if cfg.quantized and cfg.activation and cfg.activation.algorithm == "auto"
            else cfg
            for key, cfg in tune_cfg.ops.items()
        }
        resolved = tune_cfg.with_ops(ops)
        self.quantized.append(resolved.fingerprint())
        return FakeQuantizedModel(model, resolved)

    @lpq.hookimpl
    def lpq_resolved_config(self, framework: str, model: Any) -> lpq.TuneConfig | None:
        if framework != "fake" or not self.tells:
            return None
        return model.tune_cfg if isinstance(model, FakeQuantizedModel) else None


def _fit(tmp_path: Path) -> lpq.TuningResult:
    """Tune a fake model with the registered fake adaptor, in ``tmp_path``'s workspace."""
    ops = [(f"op{i}", "Conv") for i in range(6)]
    # kl halves each op's cost: still 0.03 short of a 1% goal, so the tuner goes on to
    # its calibration stage (minmax, kl) and beyond.
    model = FakeModel(ops=ops, sensitivity={f"op{i}": 0.02 for i in range(6)}, kl_helps=True)
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=6, objective="modelsize"),
    )
    return fit_fake(model, conf, tmp_path)


def test_a_proposal_of_what_auto_resolved_to_is_not_run_again(lpq_plugin, tmp_path):
    plugin = ResolvesAuto(tmp_path)
    lpq_plugin(plugin, name="fake")
    result = _fit(tmp_path)
    first = result.trials[0]
    assert first.resolved_fingerprint and first.resolved_fingerprint != first.fingerprint
    # "calibrate with kl" is what trial 0 already ran: no trial, no quantization for it.
    stages = [t.stage for t in result.trials]
    assert "calibrate with minmax" in stages and "calibrate with kl" not in stages, stages
    assert len(plugin.quantized) == len(set(plugin.quantized)), "a model was built twice"
    assert plugin.calls["quantize"] == len(result.trials)


def test_without_the_hook_the_same_model_is_built_twice(lpq_plugin, tmp_path):
    """The case the hook is for (and proof the test above can fail)."""
    plugin = ResolvesAuto(tmp_path, tells=False)
    lpq_plugin(plugin, name="fake")
    result = _fit(tmp_path)
    assert "calibrate with kl" in [t.stage for t in result.trials]
    assert len(plugin.quantized) > len(set(plugin.quantized))


def test_a_resumed_run_answers_the_resolved_proposal_from_its_history(lpq_plugin, tmp_path):
    lpq_plugin(ResolvesAuto(tmp_path), name="fake")
    _fit(tmp_path)
    result = _fit(tmp_path)  # the same workspace: a resumed run
    # Trial 0 is replayed, and with it what it resolved to: "calibrate with kl" is answered
    # from it again, not run as a new trial.
    assert all(t.resumed for t in result.trials)
    assert "calibrate with kl" not in [t.stage for t in result.trials]
