"""The tuner and strategies against the scripted fake adaptor (no framework needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import lpq
from lpq.api import fit, quantize
from lpq.config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel

EVAL = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
CALIB = [np.zeros((100, 1), np.float32)]


def concentrated_model(n: int = 24, culprits: tuple[int, ...] = (5, 17)) -> FakeModel:
    """Most ops are harmless; a few carry nearly all the quantization error."""
    ops = [(f"op{i}", "Conv" if i % 3 else "MatMul") for i in range(n)]
    sensitivity = {f"op{i}": 0.0002 for i in range(n)}
    for i in culprits:
        sensitivity[f"op{i}"] = 0.08
    return FakeModel(ops=ops, sensitivity=sensitivity)


def conf(strategy: str = "auto", **tuning: object) -> PostTrainingQuantConfig:
    return PostTrainingQuantConfig(
        accuracy_criterion=AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=TuningCriterion(strategy=strategy, **tuning),  # type: ignore[arg-type]
    )


@pytest.fixture
def fake(lpq_plugin, tmp_path: Path) -> FakeAdaptorPlugin:
    plugin = FakeAdaptorPlugin(tmp_path)
    lpq_plugin(plugin, name="fake")
    return plugin


def run(model: FakeModel, config: PostTrainingQuantConfig, tmp_path: Path, **kw: object):
    return fit(model, config, CALIB, eval_dataloader=EVAL, workspace=tmp_path / "ws", **kw)


@pytest.mark.parametrize("strategy", ["auto", "basic", "mse", "conservative"])
def test_every_strategy_meets_a_reachable_goal(fake, tmp_path, strategy):
    result = run(concentrated_model(), conf(strategy), tmp_path)
    assert result.goal_met
    assert result.best.accuracy >= 0.9 * 0.99 - 1e-9
    fallen = {name for (name, _), cfg in result.tune_cfg.ops.items() if not cfg.quantized}
    assert {"op5", "op17"} <= fallen, "the two damaging ops must be left in fp32"
    assert result.best.quantized_ops >= 10


def test_auto_needs_fewer_trials_than_basic_when_damage_is_concentrated(fake, tmp_path):
    auto = run(concentrated_model(), conf("auto"), tmp_path / "a")
    basic = run(concentrated_model(), conf("basic"), tmp_path / "b")
    assert auto.goal_met and basic.goal_met
    assert len(auto.trials) <= 3
    assert len(auto.trials) < len(basic.trials)


def test_auto_without_inspection_still_reaches_the_goal(lpq_plugin, tmp_path):
    lpq_plugin(FakeAdaptorPlugin(tmp_path, inspect=False), name="fake")
    result = run(concentrated_model(), conf("auto"), tmp_path)
    assert result.goal_met


def test_default_config_that_meets_the_goal_stops_after_one_trial(fake, tmp_path):
    model = FakeModel(ops=[("a", "Conv"), ("b", "MatMul")], sensitivity={})
    result = run(model, conf("auto"), tmp_path)
    assert result.goal_met and len(result.trials) == 1
    assert result.best.quantized_ops == 2
    assert result.summary()["latency_speedup"] == pytest.approx(1 / 0.3, rel=1e-6)


def test_best_exit_policy_narrows_fallback_to_the_culprits(fake, tmp_path):
    result = run(concentrated_model(), conf("auto", exit_policy="best", max_trials=40), tmp_path)
    fallen = {name for (name, _), cfg in result.tune_cfg.ops.items() if not cfg.quantized}
    assert fallen == {"op5", "op17"}


def test_goal_not_met_returns_most_accurate_candidate(fake, tmp_path):
    model = FakeModel(ops=[("a", "Conv"), ("b", "Conv")], sensitivity={"a": 0.3, "b": 0.2})
    result = run(model, conf("mse", max_trials=1), tmp_path)
    assert not result.goal_met
    assert result.model is not None
    assert result.best.index == 0
    assert "no configuration met the accuracy goal" in result.stop_reason


@pytest.mark.parametrize("strategy", ["auto", "basic", "mse", "random"])
def test_all_fp32_is_never_offered_as_the_answer(fake, tmp_path, strategy):
    """Only leaving every op in fp32 would meet this goal: that is the baseline, not a
    quantized model, so the goal counts as missed and the best quantized try is returned."""
    model = FakeModel(ops=[("a", "Conv"), ("b", "Conv")], sensitivity={"a": 0.3, "b": 0.2})
    result = run(model, conf(strategy, max_trials=10), tmp_path)
    assert not result.goal_met
    assert result.best.quantized_ops >= 1
    assert result.best.accuracy == pytest.approx(0.9 - 0.2)  # only "b" quantized
    assert all(t.quantized_ops >= 1 for t in result.trials)


def test_max_trials_is_respected(fake, tmp_path):
    result = run(concentrated_model(), conf("random", max_trials=5), tmp_path)
    assert len(result.trials) == 5


def test_resume_after_crash_repeats_no_finished_trial(lpq_plugin, tmp_path):
    fake = FakeAdaptorPlugin(tmp_path, interrupt_at_quantize=6)  # Ctrl-C during trial 6
    lpq_plugin(fake, name="fake")
    model = concentrated_model()
    config = conf("basic")
    with pytest.raises(KeyboardInterrupt):
        run(model, config, tmp_path)
    history_files = list((tmp_path / "ws").glob("*/history.json"))
    assert len(history_files) == 1
    saved = json.loads(history_files[0].read_text())
    assert len(saved["trials"]) == 5 and not saved.get("finished")

    fake.calls.clear()
    fake.interrupt_at_quantize = None
    result = run(model, config, tmp_path)
    resumed = [t for t in result.trials if t.resumed]
    assert len(resumed) == 5
    fresh = [t for t in result.trials if not t.resumed]
    # Each fresh trial quantizes once; the final model of a resumed best costs one more.
    assert fake.calls["quantize"] <= len(fresh) + 2
    assert result.goal_met


def test_same_run_twice_is_deterministic_and_fully_resumed(fake, tmp_path):
    first = run(concentrated_model(), conf("random", max_trials=6, seed=7), tmp_path)
    second = run(concentrated_model(), conf("random", max_trials=6, seed=7), tmp_path)
    assert [t.fingerprint for t in first.trials] == [t.fingerprint for t in second.trials]
    assert all(t.resumed for t in second.trials)


def test_history_is_plain_json_with_every_trial(fake, tmp_path):
    result = run(concentrated_model(), conf("auto"), tmp_path)
    data = json.loads(Path(result.history_path).read_text())
    assert data["finished"] is True and data["goal_met"] is True
    assert len(data["trials"]) == len(result.trials)
    for trial in data["trials"]:
        assert {"tune_cfg", "accuracy", "latency_ms", "duration_s"} <= set(trial)
        lpq.TuneConfig.from_json(trial["tune_cfg"])


def test_eval_function_that_raises_is_reported_and_history_kept(fake, tmp_path):
    def flaky_eval(model):
        if getattr(model, "tune_cfg", None) is not None:
            raise RuntimeError("metric server is down")
        return 0.9

    with pytest.raises(lpq.TuningError, match="no trial produced a usable model") as info:
        fit(
            concentrated_model(),
            conf("auto", max_trials=3),
            CALIB,
            eval_func=flaky_eval,
            workspace=tmp_path / "ws",
        )
    assert "metric server is down" in str(info.value)
    history = json.loads(next((tmp_path / "ws").glob("*/history.json")).read_text())
    assert history["trials"] and all(t["status"] == "error" for t in history["trials"])


def test_eval_func_is_used_for_accuracy(fake, tmp_path):
    result = fit(
        concentrated_model(),
        conf("auto"),
        CALIB,
        eval_func=lambda m: m.accuracy() if hasattr(m, "accuracy") else 0.9,
        workspace=tmp_path / "ws",
    )
    assert result.goal_met and result.metric == "eval_func"


def test_unlabelled_eval_data_compares_with_fp32(fake, tmp_path):
    result = fit(
        concentrated_model(),
        conf("auto"),
        CALIB,
        eval_dataloader=[np.zeros((100, 1), np.float32)],
        workspace=tmp_path / "ws",
    )
    assert result.metric == "agreement"
    assert result.baseline.accuracy == pytest.approx(1.0)


def test_op_overrides_force_fallback_and_must_match(fake, tmp_path):
    config = conf("auto")
    config.op_name_dict = {"op1[0-9]": "fp32"}
    result = run(concentrated_model(), config, tmp_path)
    for (name, _), cfg in result.tune_cfg.ops.items():
        if name.startswith("op1") and len(name) == 4:
            assert cfg.precision == "fp32"
    bad = conf("auto")
    bad.op_name_dict = {"no_such_op": "fp32"}
    with pytest.raises(lpq.ConfigError, match="matches no quantizable op"):
        run(concentrated_model(), bad, tmp_path / "b")


def test_approach_dynamic_only_uses_dynamic_capabilities(fake, tmp_path):
    config = PostTrainingQuantConfig(approach="dynamic")
    result = quantize(concentrated_model(), config, CALIB)
    modes = {cfg.mode for cfg in result.tune_cfg.ops.values() if cfg.quantized}
    assert modes == {"dynamic"}
    assert {k[1] for k, c in result.tune_cfg.ops.items() if c.quantized} == {"MatMul"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tolerable_loss": -0.1},
        {"tolerable_loss": 1.5},
        {"tolerable_loss": math.nan},
        {"criterion": "percent"},
    ],
)
def test_bad_accuracy_criterion_is_a_config_error(kwargs):
    with pytest.raises(lpq.ConfigError):
        AccuracyCriterion(**kwargs)


def test_unknown_strategy_and_metric_are_config_errors(fake, tmp_path):
    with pytest.raises(lpq.ConfigError, match="unknown strategy"):
        run(concentrated_model(), conf("nope"), tmp_path)
    with pytest.raises(lpq.ConfigError, match="unknown metric"):
        fit(
            concentrated_model(),
            conf(),
            CALIB,
            eval_dataloader=EVAL,
            eval_metric="nope",
            workspace=tmp_path / "ws",
        )


def test_generator_dataloader_is_rejected_with_a_hint(fake, tmp_path):
    with pytest.raises(lpq.ConfigError, match="one-shot iterator"):
        fit(
            concentrated_model(),
            conf(),
            (x for x in CALIB),
            eval_dataloader=EVAL,
            workspace=tmp_path / "ws",
        )


def test_objective_modelsize_measures_saved_size(fake, tmp_path):
    result = run(concentrated_model(), conf("auto", objective="modelsize"), tmp_path)
    assert result.best.size_bytes and result.best.size_bytes > 0


def test_backend_profile_options_and_capability_file_apply(lpq_plugin, tmp_path):
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text(
        "- version: {name: default}\n"
        "  precisions: [int8, fp32]\n"
        "  ops: {int8: [Conv], fp32: ['*']}\n"
        "  capabilities:\n"
        "    int8:\n"
        "      static:\n"
        "        Conv:\n"
        "          weight: {dtype: [int8], granularity: [per_tensor]}\n"
        "          activation: {dtype: [uint8], scheme: [asym]}\n"
    )

    class Profiles:
        @lpq.hookimpl
        def lpq_register_backend_profiles(self, register):
            register(
                lpq.BackendProfile(
                    "fake-narrow", "fake", options={"threads": 1}, capability_file=narrow
                )
            )

    lpq_plugin(FakeAdaptorPlugin(tmp_path), name="fake")
    lpq_plugin(Profiles(), name="profiles")
    result = quantize(concentrated_model(), PostTrainingQuantConfig(backend="fake-narrow"), CALIB)
    assert result.tune_cfg.options["threads"] == 1
    conv = [c for (_, t), c in result.tune_cfg.ops.items() if t == "Conv"]
    assert conv and all(c.weight.granularity == "per_tensor" for c in conv)
    assert not any(c.quantized for (_, t), c in result.tune_cfg.ops.items() if t == "MatMul")
    with pytest.raises(lpq.ConfigError, match="unknown backend profile"):
        quantize(concentrated_model(), PostTrainingQuantConfig(backend="nope"), CALIB)


def test_marginal_errors_rank_the_op_that_adds_the_damage_first():
    from lpq.tuning.sensitivity import marginal_errors

    # A chain where fc2 introduces the error and later ops only carry it along.
    raw = {
        ("fc1", "MatMul"): 0.001,
        ("fc2", "MatMul"): 0.6,
        ("fc3", "MatMul"): 0.62,
        ("fc4", "MatMul"): 1.0,
        ("fc5", "MatMul"): 1.05,
    }
    scores = marginal_errors(raw)
    order = sorted(scores, key=lambda k: -scores[k])
    assert [name for name, _ in order[:2]] == ["fc2", "fc4"]


def test_relative_error_sees_channels_destroyed_next_to_an_outlier():
    from lpq.tuning.sensitivity import relative_error

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(32, 16))
    ref[:, 0] *= 300.0  # an outlier feature dominates the tensor's energy
    crushed = ref.copy()
    crushed[:, 1:] = 0.0  # a coarse per-tensor scale rounds every other feature to 0
    energy_ratio = np.mean((crushed - ref) ** 2) / np.mean(ref**2)
    assert energy_ratio < 1e-3  # a plain relative MSE barely notices
    assert relative_error(ref, crushed) > 0.5
    assert relative_error(ref, ref + 1e-3) < 1e-4
