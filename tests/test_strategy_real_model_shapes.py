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
from lpq.testing.fake_adaptor import (
    CAPABILITY_YAML,
    FakeAdaptorPlugin,
    FakeModel,
    FakeQuantizedModel,
)

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


def chain_with_decoys(model, is_decoy) -> lpq.Inspection:
    """Activations whose error accumulates down the chain of ops (the real damage), plus
    a large error on quantized ``is_decoy(name, op_type)`` ops that costs the output
    nothing."""
    source = model.source if isinstance(model, FakeQuantizedModel) else model
    activations, damage = {}, 0.0
    for name, op_type in source.ops:
        quantized = isinstance(model, FakeQuantizedModel) and (
            model.tune_cfg.ops[(name, op_type)].quantized
        )
        damage += source.sensitivity.get(name, 0.0) if quantized else 0.0
        value = np.ones((2, 4), np.float32)
        value[:, 0] += np.float32(np.sqrt(damage))
        if quantized and is_decoy(name, op_type):
            value[:, 1] += 3.0
        activations[name] = [value]
    return lpq.Inspection(activations=activations)


class LoneOpsRunFloat(FakeAdaptorPlugin):
    """Like ORT on Silero VAD: Add and Sigmoid are planned int8 but have no int8 kernel
    alone, so the converted model runs them in float (reported by ``lpq_quantized_ops``);
    inspection shows a large error on them (decoys) and the real, accumulated error on
    the convs."""

    float_types = ("Add", "Sigmoid")

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        yaml = CAPABILITY_YAML.replace("int8: [Conv, MatMul]", "int8: [Conv, MatMul, Add, Sigmoid]")
        self.capability_file.write_text(yaml)

    @lpq.hookimpl
    def lpq_quantized_ops(self, framework, model):
        if framework != "fake" or not isinstance(model, FakeQuantizedModel):
            return None
        return {
            name: "fp32" if not cfg.quantized or op_type in self.float_types else "int8"
            for (name, op_type), cfg in model.tune_cfg.ops.items()
        }

    @lpq.hookimpl
    def lpq_inspect_tensor(self, framework, model, dataloader, op_names, kind, iteration):
        if framework != "fake":
            return None
        return chain_with_decoys(model, lambda name, op_type: op_type in self.float_types)


def test_ops_that_run_in_float_are_never_probed(lpq_plugin, tmp_path):
    """Falling back an Add that runs in float anyway changes nothing: the op-wise stage
    probes only ops the converted model runs in int8, and finds the culprit conv."""
    lpq_plugin(LoneOpsRunFloat(tmp_path), name="fake")
    ops = [(f"conv{i}", "Conv") for i in range(6)]
    ops += [("add0", "Add"), ("add1", "Add"), ("sigmoid0", "Sigmoid")]
    cost = {f"conv{i}": 0.0005 for i in range(6)} | {"conv3": 0.04}
    result = fit(FakeModel(ops=ops, sensitivity=cost), tmp_path / "ws")
    stages = [t.stage for t in result.trials]
    assert result.goal_met, stages
    assert fallen(result) == {"conv3"}, "only the culprit conv stays float"
    for trial in result.trials:
        config = trial.config()
        assert config is not None
        probed = {name for (name, _), c in config.ops.items() if not c.quantized}
        assert not probed & {"add0", "add1", "sigmoid0"}, (trial.stage, probed)
    assert len(result.trials) <= 10, stages


class SlowUnlessConvsRunInt8(FakeAdaptorPlugin):
    """Int8 MatMuls alone are Q/DQ churn: the model is faster than fp32 only with most
    convs in int8. Inspection shows the largest error on a harmless conv (``conv5``)."""

    @lpq.hookimpl
    def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics, measurer, iteration):
        result = super().lpq_evaluate(
            framework, model, dataloader, postprocess, metrics, None, iteration
        )
        if result is not None and measurer is not None:
            latency = 10.0
            if isinstance(model, FakeQuantizedModel):
                convs = [c for (_, t), c in model.tune_cfg.ops.items() if t == "Conv"]
                latency = 12.0 - 5.0 * sum(c.quantized for c in convs) / len(convs)
            measurer.samples.append(latency / 1e3)
            result.latency_ms = measurer.median_ms
        return result

    @lpq.hookimpl
    def lpq_inspect_tensor(self, framework, model, dataloader, op_names, kind, iteration):
        if framework != "fake":
            return None
        return chain_with_decoys(model, lambda name, op_type: name == "conv5")


def test_a_whole_op_type_fallen_for_one_op_is_won_back(lpq_plugin, tmp_path):
    """Falling back every conv fixes accuracy but leaves only int8 MatMuls, slower than
    fp32: the tuner wins the harmless convs back in one batch."""
    lpq_plugin(SlowUnlessConvsRunInt8(tmp_path), name="fake")
    ops = [(f"conv{i}", "Conv") for i in range(6)] + [("mm0", "MatMul"), ("mm1", "MatMul")]
    cost = {name: 0.0005 for name, _ in ops} | {"conv3": 0.04}
    result = fit(FakeModel(ops=ops, sensitivity=cost), tmp_path / "ws")
    stages = [t.stage for t in result.trials]
    assert result.goal_met, [(t.stage, t.accuracy, t.latency_ms) for t in result.trials]
    assert result.best.stage.startswith("win back all but"), stages
    assert "conv3" in fallen(result) and len(fallen(result)) <= 3
    assert result.summary()["latency_speedup"] > 1
    assert len(result.trials) <= 12, stages


class AddsNeedInt8Convs(SlowUnlessConvsRunInt8):
    """Like ORT on PP-OCRv4 det: an Add or MatMul runs int8 only while some conv does
    (QLinearAdd needs int8 neighbours), so falling back every conv leaves nothing int8.
    Inspection shows the largest error on the Adds, which cost the output little."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        yaml = CAPABILITY_YAML.replace("int8: [Conv, MatMul]", "int8: [Conv, MatMul, Add]")
        self.capability_file.write_text(yaml)

    @lpq.hookimpl
    def lpq_quantized_ops(self, framework, model):
        if framework != "fake" or not isinstance(model, FakeQuantizedModel):
            return None
        ops = model.tune_cfg.ops
        any_conv = any(c.quantized for (_, t), c in ops.items() if t == "Conv")
        return {
            name: "int8" if c.quantized and (t == "Conv" or any_conv) else "fp32"
            for (name, t), c in ops.items()
        }

    @lpq.hookimpl
    def lpq_inspect_tensor(self, framework, model, dataloader, op_names, kind, iteration):
        if framework != "fake":
            return None
        return chain_with_decoys(model, lambda name, op_type: op_type == "Add")


def det_like_model(harmful: dict[str, float]) -> FakeModel:
    ops = [(f"conv{i}", "Conv") for i in range(8)] + [(f"add{i}", "Add") for i in range(3)]
    ops += [("mm0", "MatMul"), ("mm1", "MatMul")]
    return FakeModel(ops=ops, sensitivity={name: 0.0005 for name, _ in ops} | harmful)


def test_an_accurate_op_type_that_leaves_nothing_int8_is_won_back(lpq_plugin, tmp_path):
    """Every conv back in fp32 is accurate but is the fp32 model in disguise (Silero VAD):
    the tuner wins the convs back but the most harmful, in one batch."""
    lpq_plugin(AddsNeedInt8Convs(tmp_path), name="fake")
    result = fit(det_like_model({"conv2": 0.02, "conv5": 0.015}), tmp_path / "ws")
    stages = [(t.stage, t.quantized_ops, t.accuracy) for t in result.trials]
    assert result.goal_met, stages
    assert result.best.stage.startswith("win back all but"), stages
    assert {"conv2", "conv5"} <= fallen(result) and len(fallen(result)) <= 4, stages
    assert len(result.trials) <= 10, stages


def test_an_op_type_whose_fallback_leaves_nothing_int8_is_not_built_on(lpq_plugin, tmp_path):
    """Four harmful convs: winning back all but three is not enough, and no further type
    may be fallen on top of the all-float model; the op-wise stage finds them."""
    lpq_plugin(AddsNeedInt8Convs(tmp_path), name="fake")
    harmful = {f"conv{i}": 0.01 for i in (1, 3, 5, 7)}
    result = fit(det_like_model(harmful), tmp_path / "ws")
    stages = [(t.stage, t.quantized_ops, t.accuracy) for t in result.trials]
    assert result.goal_met, stages
    all_float = [t.stage for t in result.trials if t.quantized_ops == 0]
    assert all_float == ["fallback op type Conv"], stages
    convs = {name for name in fallen(result) if name.startswith("conv")}
    assert convs == set(harmful), stages  # (Adds are decoys: cheap to fall back, harmless)
