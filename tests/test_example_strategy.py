"""The worked strategy plugin of docs/writing-a-strategy.md: ``examples/lpq-example-strategy``.

Its ``bisect`` strategy is run by ``lpq.fit`` against the scripted fake adaptor (every
trial's accuracy is exact), registered the fast way (the ``lpq_plugin`` fixture) for the
behaviour, and found through its real entry point (its ``pyproject.toml`` metadata as a
fake installed distribution) for the packaging. A slow test builds its wheel.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from core_testutil import REPO, FakeSite, add_example_distribution, build_example_wheel
from packaging.requirements import Requirement

import lpq
from lpq.plugins.discovery import core_satisfies
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel

EXAMPLE = REPO / "examples" / "lpq-example-strategy"
PROJECT = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
REQUIRES_CORE = next(r for r in PROJECT["dependencies"] if r.startswith("lpq-core"))

sys.path.insert(0, str(EXAMPLE))  # the package, as `pip install -e` would make it importable

from lpq_example_strategy import plugin  # noqa: E402
from lpq_example_strategy.bisection import BisectStrategy, split  # noqa: E402

EVAL = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
CALIB = [np.zeros((100, 1), np.float32)]


def concentrated_model(n: int = 24, culprits: tuple[int, ...] = (5, 17)) -> FakeModel:
    """Most ops are harmless; two carry nearly all the quantization error."""
    ops = [(f"op{i}", "Conv" if i % 3 else "MatMul") for i in range(n)]
    sensitivity = {f"op{i}": 0.0002 for i in range(n)}
    for i in culprits:
        sensitivity[f"op{i}"] = 0.08
    return FakeModel(ops=ops, sensitivity=sensitivity)


def config(**tuning: object) -> lpq.PostTrainingQuantConfig:
    return lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(strategy="bisect", **tuning),  # type: ignore[arg-type]
    )


@pytest.fixture
def fake(lpq_plugin, tmp_path: Path) -> FakeAdaptorPlugin:
    adaptor = FakeAdaptorPlugin(tmp_path)
    lpq_plugin(adaptor, name="fake")
    lpq_plugin(plugin, name="example-strategy")
    return adaptor


def tune(model: FakeModel, conf: lpq.PostTrainingQuantConfig, workspace: Path) -> lpq.TuningResult:
    return lpq.fit(model, conf, CALIB, eval_dataloader=EVAL, workspace=workspace)


def fallen_back(result: lpq.TuningResult) -> set[str]:
    return {name for (name, _), cfg in result.tune_cfg.ops.items() if not cfg.quantized}


def test_bisect_meets_a_reachable_goal_falling_back_only_the_culprits(fake, tmp_path):
    result = tune(concentrated_model(), config(), tmp_path / "ws")
    assert result.goal_met
    assert fallen_back(result) == {"op5", "op17"}
    assert result.best.quantized_ops == 22
    # Two culprits among 24 ops, two groups per split: about 2 * 2 * log2(24) trials.
    assert len(result.trials) <= 21
    # The config it settles on after each bisection was already tried by the bisection:
    # the engine answers it from that trial, so no trial has the settling stage.
    assert not [t for t in result.trials if t.stage.startswith("fall back")]


def test_a_probe_that_meets_the_goal_does_not_end_the_walk(fake, tmp_path):
    # exit_policy defaults to first_hit; bisect sets honours_first_hit = False because a
    # probe that falls back half the model may meet the goal (and is a poor answer).
    result = tune(concentrated_model(), config(), tmp_path / "ws")
    first_hit = next(t for t in result.trials if t.meets_goal)
    assert first_hit.quantized_ops < result.best.quantized_ops
    assert result.best.index > first_hit.index


def test_it_respects_max_trials(fake, tmp_path):
    result = tune(concentrated_model(), config(max_trials=5), tmp_path / "ws")
    assert len(result.trials) == 5
    assert "max trials (5)" in result.stop_reason
    assert not result.goal_met


def test_strategy_options_reach_the_factory(fake, tmp_path):
    result = tune(concentrated_model(), config(strategy_options={"parts": 4}), tmp_path / "ws")
    assert result.goal_met
    assert fallen_back(result) == {"op5", "op17"}
    first_split = [t for t in result.trials if t.stage == "bisect 24 ops"]
    assert len(first_split) == 4, "parts=4: the first split falls back four groups"
    strategy = lpq.get_plugin_manager().create_strategy("bisect", parts=3, order="random")
    assert isinstance(strategy, BisectStrategy)
    assert (strategy.parts, strategy.order, strategy.options["min_gain"]) == (3, "random", 0.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"parts": 1}, "parts must be a whole number >= 2"),
        ({"order": "reverse"}, "order must be one of graph, random"),
        ({"min_gain": -1}, "min_gain must be a number >= 0"),
        ({"part": 2}, "has no option 'part'"),
    ],
)
def test_bad_options_are_config_errors(fake, tmp_path, options, message):
    with pytest.raises(lpq.ConfigError, match=message):
        tune(concentrated_model(), config(strategy_options=options), tmp_path / "ws")


def test_random_order_is_seeded_by_ctx_rng(fake, tmp_path):
    def walk(seed: int, name: str) -> list[str]:
        conf = config(strategy_options={"order": "random"}, seed=seed)
        result = tune(concentrated_model(), conf, tmp_path / name)
        assert result.goal_met and fallen_back(result) == {"op5", "op17"}
        return [t.fingerprint for t in result.trials]

    assert walk(1, "a") == walk(1, "b"), "the same seed walks the same path"
    assert walk(1, "a") != walk(2, "c"), "another seed splits the suspects differently"


def test_a_rerun_resumes_from_the_history(fake, tmp_path):
    conf = config(strategy_options={"order": "random"})
    first = tune(concentrated_model(), conf, tmp_path / "ws")
    quantized = fake.calls["quantize"]
    again = tune(concentrated_model(), conf, tmp_path / "ws")
    assert [t.fingerprint for t in again.trials] == [t.fingerprint for t in first.trials]
    assert all(t.resumed for t in again.trials)
    assert fake.calls["quantize"] - quantized <= 1, "only the chosen model is rebuilt"


def test_it_stops_when_only_fp32_is_left(fake, tmp_path):
    # One op, too costly to quantize: its fallback is the fp32 model itself, which the
    # engine answers as "skipped" (index -1, no trial spent); bisect stops there.
    model = FakeModel(ops=[("only", "Conv")], sensitivity={"only": 0.5})
    result = tune(model, config(), tmp_path / "ws")
    assert not result.goal_met
    assert [t.stage for t in result.trials] == ["default"]


def test_split_keeps_order_and_sizes():
    keys = [(f"op{i}", "Conv") for i in range(7)]
    assert [len(g) for g in split(keys, 2)] == [4, 3]
    assert [len(g) for g in split(keys, 3)] == [3, 2, 2]
    assert [len(g) for g in split(keys[:2], 4)] == [1, 1]
    assert [k for g in split(keys, 3) for k in g] == keys


# --------------------------------------------------------------------------- packaging


@pytest.fixture
def example_site(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
    """The example as an installed distribution: its real metadata, its folder on the path."""
    add_example_distribution(fake_site, EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return fake_site


@pytest.mark.xfail(
    not core_satisfies(REQUIRES_CORE.removeprefix("lpq-core")),
    reason=f"the example requires {REQUIRES_CORE}; this lpq-core is {lpq.__version__}",
    strict=True,
)
def test_the_example_is_found_through_its_entry_point(example_site: FakeSite) -> None:
    pm = lpq.get_plugin_manager()
    record = next(r for r in pm.records() if r.name == "example-strategy")
    assert record.status.value == "ok", record.message
    assert record.distribution == "lpq-example-strategy"
    assert record.hooks == ["lpq_register_strategies"]
    assert isinstance(pm.create_strategy("bisect"), BisectStrategy)


@pytest.mark.slow
def test_the_example_builds_a_wheel_with_its_entry_point(tmp_path: Path) -> None:
    wheel = build_example_wheel(EXAMPLE, tmp_path)
    assert "example-strategy = lpq_example_strategy.plugin" in wheel.entry_points
    assert Requirement(REQUIRES_CORE) in wheel.requires
    assert "lpq_example_strategy/bisection.py" in wheel.names
