"""Capability ``recipes``: model-wide options (e.g. SmoothQuant, latency-aware
quantization) that an adaptor declares in YAML and the tuner searches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from core_testutil import fit_fake

import lpq
from lpq.plan.tuning_space import build_tuning_space
from lpq.testing.fake_adaptor import CAPABILITY_YAML, FakeAdaptorPlugin, FakeModel

RECIPES = "  recipes:\n    smooth: [false, true]\n    latency_aware: [false, true]\n"


def capability_file(folder: Path, extra: str = RECIPES) -> Path:
    path = folder / "with-recipes.yaml"
    path.write_text(CAPABILITY_YAML + extra)
    return path


def test_recipes_load_and_merge_across_files(tmp_path):
    first = capability_file(tmp_path)
    second = tmp_path / "more.yaml"
    second.write_text(CAPABILITY_YAML + "  recipes:\n    smooth: [false, alpha_0_8]\n")
    spec = lpq.load_capability([first, second], "fake", None)
    assert spec.recipes == {"smooth": (False, True, "alpha_0_8"), "latency_aware": (False, True)}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("  recipes:\n    smooth: []\n", "should be non-empty"),
        ("  recipes:\n    Smooth-Quant: [true]\n", "does not match"),
        ("  recipes:\n    smooth: [{a: 1}]\n", "expected"),
    ],
)
def test_malformed_recipes_are_capability_errors(tmp_path, extra, message):
    with pytest.raises(lpq.CapabilityError, match=message):
        lpq.load_capability(capability_file(tmp_path, extra), "fake", None)


def space_for(tmp_path: Path, conf: lpq.PostTrainingQuantConfig, **options):
    spec = lpq.load_capability(capability_file(tmp_path), "fake", None)
    capability = spec.build([("op0", "Conv"), ("op1", "MatMul")], None)
    return build_tuning_space(capability, conf, has_calib_data=True, extra_options=options)


def test_default_config_takes_each_recipes_first_value(tmp_path):
    space = space_for(tmp_path, lpq.PostTrainingQuantConfig())
    assert space.default().options == {"smooth": False, "latency_aware": False}
    labels = [label for label, _ in space.recipe_variants(space.default())]
    assert labels == ["smooth=True", "latency_aware=True"]


def test_a_recipe_set_by_the_user_or_a_profile_is_not_searched(tmp_path):
    space = space_for(tmp_path, lpq.PostTrainingQuantConfig(), latency_aware=True)
    assert space.default().options["latency_aware"] is True
    assert list(space.recipes) == ["smooth"]


def tune(model: FakeModel, conf: lpq.PostTrainingQuantConfig, tmp_path: Path):
    """``lpq.fit`` on the fake adaptor, labelled data of 1000 samples."""
    return fit_fake(model, conf, tmp_path)


def one_harmful_op(op_type: str, count: int, each: float) -> FakeModel:
    """``count`` ops of ``op_type`` costing ``each`` accuracy when quantized, but op3 0.05."""
    ops = [(f"op{i}", op_type) for i in range(count)]
    return FakeModel(ops=ops, sensitivity={f"op{i}": each for i in range(count)} | {"op3": 0.05})


def one_percent_goal(max_trials: int = 20) -> lpq.PostTrainingQuantConfig:
    return lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=max_trials),
    )


class SmoothingAdaptor(FakeAdaptorPlugin):
    """Its 'smooth' recipe halves every op's accuracy cost, as SmoothQuant does for
    outlier-heavy MatMuls."""

    #: What 'smooth' multiplies each op's accuracy cost by.
    factor = 0.25

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.capability_file.write_text(CAPABILITY_YAML + RECIPES)

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None
        if tune_cfg.options.get("smooth"):
            scaled = {k: v * self.factor for k, v in model.sensitivity.items()}
            model = FakeModel(ops=model.ops, sensitivity=scaled)
        return super().lpq_quantize(framework, model, tune_cfg, calib_dataloader, train_func)


def test_auto_tries_recipes_before_falling_back_ops(lpq_plugin, tmp_path):
    lpq_plugin(SmoothingAdaptor(tmp_path), name="fake")
    ops = [(f"op{i}", "MatMul") for i in range(10)]
    model = FakeModel(ops=ops, sensitivity={f"op{i}": 0.002 for i in range(10)})
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=10),
    )
    result = tune(model, conf, tmp_path)
    assert result.goal_met
    assert result.tune_cfg.options["smooth"] is True
    assert result.best.quantized_ops == 10, "the recipe, not a fallback, met the goal"
    assert result.best.stage == "recipe smooth=True"


class BarelySmoothingAdaptor(SmoothingAdaptor):
    """Its 'smooth' recipe trims every op's accuracy cost by 1%: a noise-level gain."""

    factor = 0.99


def test_a_recipe_with_a_noise_level_gain_is_not_carried_into_later_trials(lpq_plugin, tmp_path):
    lpq_plugin(BarelySmoothingAdaptor(tmp_path), name="fake")
    result = tune(one_harmful_op("MatMul", 10, 0.001), one_percent_goal(), tmp_path)
    stages = [t.stage for t in result.trials]
    assert "recipe smooth=True" in stages, "the recipe was tried"
    smooth = next(t for t in result.trials if t.stage == "recipe smooth=True")
    default = next(t for t in result.trials if t.stage == "default")
    assert smooth.accuracy > default.accuracy, "it did gain, a little"
    assert result.goal_met
    assert result.tune_cfg.options["smooth"] is False, "a 1% gain is not worth keeping"
    later = [t for t in result.trials if t.index > smooth.index]
    assert later
    assert all(lpq.TuneConfig.from_json(t.tune_cfg).options["smooth"] is False for t in later)


def test_quantize_turns_latency_awareness_on_unless_told_otherwise(lpq_plugin, tmp_path):
    lpq_plugin(SmoothingAdaptor(tmp_path), name="fake")
    model = FakeModel(ops=[("op0", "Conv"), ("op1", "MatMul")])
    calib = [np.zeros((4, 1), np.float32)]
    assert lpq.quantize(model, None, calib).tune_cfg.options["latency_aware"] is True
    off = lpq.PostTrainingQuantConfig(latency_aware=False)
    assert lpq.quantize(model, off, calib).tune_cfg.options["latency_aware"] is False
    space = space_for(tmp_path, lpq.PostTrainingQuantConfig(latency_aware=True))
    assert "latency_aware" not in space.recipes, "a value the user set is not searched"


class SlowUnlessLatencyAware(SmoothingAdaptor):
    """Quantized models measure slower than fp32 unless ``latency_aware`` is on (what
    int8 islands between float ops do on a real CPU)."""

    fast_option = "latency_aware"

    def __init__(self, folder: Path, recipes: str = RECIPES) -> None:
        super().__init__(folder)
        self.capability_file.write_text(CAPABILITY_YAML + recipes)

    @lpq.hookimpl
    def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics, measurer, iteration):
        result = super().lpq_evaluate(
            framework, model, dataloader, postprocess, metrics, None, iteration
        )
        if result is not None and measurer is not None:
            options = getattr(getattr(model, "tune_cfg", None), "options", None)
            latency = 10.0  # the fp32 model
            if options is not None:  # int8: slower, unless latency-aware
                latency = 6.0 if options.get(self.fast_option) else 13.0
            measurer.samples.append(latency / 1e3)
            result.latency_ms = measurer.median_ms
        return result


class SlowUnlessFused(SlowUnlessLatencyAware):
    """As above, with a recipe the tuner does not start from (``fuse``)."""

    fast_option = "fuse"

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, "  recipes:\n    smooth: [false, true]\n    fuse: [false, true]\n")


def test_an_accurate_but_slow_candidate_is_sped_up_with_a_recipe(lpq_plugin, tmp_path):
    lpq_plugin(SlowUnlessFused(tmp_path), name="fake")
    result = tune(one_harmful_op("Conv", 8, 0.0002), one_percent_goal(), tmp_path)
    assert result.goal_met, [(t.stage, t.accuracy, t.latency_ms) for t in result.trials]
    assert result.tune_cfg.options["fuse"] is True
    assert result.best.stage.startswith("speed up with")
    assert result.summary()["latency_speedup"] > 1


@pytest.mark.parametrize(("objective", "first"), [("performance", True), ("modelsize", False)])
def test_tuning_for_speed_starts_latency_aware(lpq_plugin, tmp_path, objective, first):
    """With the performance objective the first trial is what ``lpq quantize`` gives
    (latency-aware), and the other value stays searchable."""
    lpq_plugin(SlowUnlessLatencyAware(tmp_path), name="fake")
    ops = [(f"op{i}", "Conv") for i in range(4)]
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=12, objective=objective),
    )
    result = tune(
        FakeModel(ops=ops, sensitivity={f"op{i}": 0.0002 for i in range(4)}), conf, tmp_path
    )
    default = result.trials[0].config()
    assert default is not None and default.options["latency_aware"] is first
    assert result.goal_met
    if first:
        assert result.summary()["latency_speedup"] > 1, "the default was already fast"


class IntSlowerEverywhere(SlowUnlessLatencyAware):
    """Latency-aware quantization keeps every op float (int8 is slower everywhere here)."""

    @lpq.hookimpl
    def lpq_quantized_ops(self, framework, model):
        if framework != "fake" or not hasattr(model, "tune_cfg"):
            return None
        aware = model.tune_cfg.options.get("latency_aware")
        return {
            name: "fp32" if aware else cfg.precision
            for (name, _), cfg in model.tune_cfg.ops.items()
        }


def test_no_calibration_trials_are_spent_on_a_model_that_runs_all_float(lpq_plugin, tmp_path):
    lpq_plugin(IntSlowerEverywhere(tmp_path), name="fake")
    ops = [(f"op{i}", "Conv") for i in range(4)]
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=4),
    )
    result = tune(
        FakeModel(ops=ops, sensitivity={f"op{i}": 0.0002 for i in range(4)}), conf, tmp_path
    )
    stages = [t.stage for t in result.trials]
    assert result.trials[0].quantized_ops == 0 and result.trials[0].counts_from == "model"
    assert not any(s.startswith("calibrate with") for s in stages), stages
    assert "recipe latency_aware=False" in stages[1:3], "in the batch right after the default"


class RecordingOptions(SmoothingAdaptor):
    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.seen: list[dict] = []

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework == "fake":
            self.seen.append(dict(tune_cfg.options))
        return super().lpq_quantize(framework, model, tune_cfg, calib_dataloader, train_func)


def test_adaptor_options_reach_every_trial_and_fix_a_recipe(lpq_plugin, tmp_path):
    plugin = RecordingOptions(tmp_path)
    lpq_plugin(plugin, name="fake")
    ops = [(f"op{i}", "MatMul") for i in range(4)]
    conf = lpq.PostTrainingQuantConfig(
        adaptor_options={"smooth": True, "latency_batch_size": 8},
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=6, exit_policy="best"),
    )
    tune(FakeModel(ops=ops, sensitivity={f"op{i}": 0.004 for i in range(4)}), conf, tmp_path)
    assert len(plugin.seen) > 1
    assert all(o["smooth"] is True and o["latency_batch_size"] == 8 for o in plugin.seen)
    quantized = lpq.quantize(FakeModel(ops=ops), conf, [np.zeros((4, 1), np.float32)])
    assert quantized.tune_cfg.options["latency_batch_size"] == 8


def test_cli_option_values_are_read_as_yaml():
    from lpq.cli.options import parse_options

    parsed = parse_options(("batch=8", "alpha=0.5", "on=true", "name=minmax", "empty="))
    assert parsed == {"batch": 8, "alpha": 0.5, "on": True, "name": "minmax", "empty": ""}


SLOW = "  recipes:\n    smooth: [false, true]\n    learn: [false, 300]\n  slow_recipes: [learn]\n"


def test_slow_recipes_load_merge_and_must_be_recipes(tmp_path):
    first = capability_file(tmp_path, SLOW)
    second = tmp_path / "more.yaml"
    second.write_text(
        CAPABILITY_YAML + "  recipes:\n    deep: [false, true]\n  slow_recipes: [deep]\n"
    )
    spec = lpq.load_capability([first, second], "fake", None)
    assert spec.slow_recipes == ("learn", "deep")
    space = build_tuning_space(
        spec.build([("op0", "Conv")], None), lpq.PostTrainingQuantConfig(), has_calib_data=True
    )
    cfg = space.default()
    assert [n for n, _ in space.recipe_variants(cfg, slow=True)] == ["learn=300", "deep=True"]
    assert [n for n, _ in space.recipe_variants(cfg, slow=False)] == ["smooth=True"]
    assert len(space.recipe_variants(cfg)) == 3
    bad = capability_file(
        tmp_path, "  recipes:\n    smooth: [false, true]\n  slow_recipes: [learn]\n"
    )
    with pytest.raises(lpq.CapabilityError, match="slow recipe 'learn' is not one of") as info:
        lpq.load_capability(bad, "fake", None)
    assert "declare learn under 'recipes'" in str(info.value.hint)


class SlowLearningAdaptor(FakeAdaptorPlugin):
    """A slow recipe ``learn`` that removes a model-wide rounding bias (``bias``
    accuracy lost by any quantized model, which no op's fallback removes), as AdaRound
    does; a cheap ``smooth`` that does nothing here."""

    bias = 0.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.capability_file.write_text(CAPABILITY_YAML + SLOW)

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None
        if not tune_cfg.options.get("learn"):
            model = FakeModel(model.ops, model.sensitivity, model.base_accuracy - self.bias)
        return super().lpq_quantize(framework, model, tune_cfg, calib_dataloader, train_func)


class BiasedRounding(SlowLearningAdaptor):
    bias = 0.015


def test_slow_recipes_wait_until_the_fallback_stages_are_through(lpq_plugin, tmp_path):
    """One harmful op: falling it back meets the goal, so the slow recipe is never paid
    for; the cheap recipe is tried in the early recipe batch."""
    lpq_plugin(SlowLearningAdaptor(tmp_path), name="fake")
    result = tune(one_harmful_op("Conv", 8, 0.0002), one_percent_goal(), tmp_path)
    stages = [t.stage for t in result.trials]
    assert result.goal_met, stages
    assert "recipe smooth=True" in stages
    assert not any("learn" in s for s in stages), stages


def test_slow_recipes_are_tried_when_fallbacks_fall_short(lpq_plugin, tmp_path):
    """A model-wide bias no fallback removes: after the fallback stages find nothing,
    the slow recipe runs, once, and meets the goal with every op int8."""
    lpq_plugin(BiasedRounding(tmp_path), name="fake")
    model = FakeModel(ops=[(f"op{i}", "Conv") for i in range(6)])
    result = tune(model, one_percent_goal(), tmp_path)
    stages = [t.stage for t in result.trials]
    assert result.goal_met, stages
    learn = [i for i, s in enumerate(stages) if s == "recipe learn=300"]
    assert len(learn) == 1, stages
    probes = [i for i, s in enumerate(stages) if s.startswith("probe ops")]
    assert probes and max(probes) < learn[0], stages
    assert result.best.stage == "recipe learn=300" and result.best.quantized_ops == 6
